"""`swarm-node status` reads a node's store: counts, rejection reasons, bans."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from node.store import LedgerEntry, Store
from protocol.identity import Identity, peer_id_to_b58
from protocol.peer_score import PeerRecord


def test_status_reports_ledger_and_bans(tmp_path):
    now = time.time()
    bad = Identity.generate().peer_id
    with Store.open(tmp_path) as store:
        for i in range(3):
            store.log(
                LedgerEntry(
                    at=now,
                    direction="in",
                    outcome="rejected",
                    kind="rollout_header",
                    item_id=bytes([i]) * 32,
                    peer=bad,
                    reason="bad_signature",
                )
            )
        store.log(
            LedgerEntry(
                at=now,
                direction="in",
                outcome="accepted",
                kind="rollout_header",
                item_id=b"\x09" * 32,
                peer=bad,
            )
        )
        store.save_peer(
            PeerRecord(peer=bad, score=-120.0, updated_at=now, banned_until=now + 600, offences=1)
        )
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--data-dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["inbound"]["rejected"] == {"bad_signature": 3}
    assert status["inbound"]["accepted"] == {"-": 1}
    assert [b["peer"] for b in status["banned"]] == [peer_id_to_b58(bad)]
    assert 500 < status["banned"][0]["until_s"] <= 600


def test_status_without_a_store_is_one_line_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--data-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no node store" in result.stderr


def test_status_text_spacing_stopped_node_and_zero_penalty_refusals(tmp_path):
    with Store.open(tmp_path) as store:
        store.log(LedgerEntry(at=time.time(), direction="in", outcome="accepted",
                              kind="rollout_header", item_id=b"\x01" * 32, peer=b"\x02" * 38))
    (tmp_path / "status.json").write_text(json.dumps({
        "pid": 999_999_999, "time": time.time() - 60, "stopped": True, "peers": 0,
        "rejected": {"duplicate": 3260, "clock_skew": 500, "malformed": 2},
    }))
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "inbound accepted 1" in out, out
    assert out.startswith("stopped ") and not any(line.startswith("live") for line in out.splitlines()), out
    assert "duplicate: 3260" in out and "clock_skew: 500" in out, out
