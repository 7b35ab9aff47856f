"""`swarm-node status` reads a node's store: counts, rejection reasons, bans."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from node.store.store import LedgerEntry, Store
from protocol.identity import Identity, peer_id_to_b58
from protocol.peer_score import PeerRecord
from tests.support.cli import run_cli


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
        store.log(
            LedgerEntry(
                at=time.time(),
                direction="in",
                outcome="accepted",
                kind="rollout_header",
                item_id=b"\x01" * 32,
                peer=b"\x02" * 38,
            )
        )
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "pid": 999_999_999,
                "time": time.time() - 60,
                "stopped": True,
                "peers": 0,
                "rejected": {"duplicate": 3260, "clock_skew": 500, "malformed": 2},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "inbound accepted 1" in out, out
    assert out.startswith("stopped ") and not any(
        line.startswith("live") for line in out.splitlines()
    ), out
    assert "duplicate: 3260" in out and "clock_skew: 500" in out, out


def test_ledger_lists_own_work_and_inbound_with_reasons(tmp_path):
    now = time.time()
    validator = Identity.generate().peer_id
    sender = Identity.generate().peer_id
    with Store.open(tmp_path) as store:
        for i in range(5):
            store.log(
                LedgerEntry(
                    at=now + i,
                    direction="out",
                    outcome="produced",
                    kind="rollout",
                    item_id=bytes([i]) * 32,
                )
            )
        store.log(
            LedgerEntry(
                at=now + 6,
                direction="out",
                outcome="rejected",
                kind="rollout",
                item_id=b"\x01" * 32,
                peer=validator,
                reason="reward-mismatch",
            )
        )
        store.log(
            LedgerEntry(
                at=now + 7,
                direction="in",
                outcome="rejected",
                kind="rollout_header",
                item_id=b"\x07" * 32,
                peer=sender,
                reason="bad_signature",
            )
        )
    r = run_cli("ledger", "--data-dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 7 and [x["seq"] for x in lines] == sorted(x["seq"] for x in lines)
    r = run_cli("ledger", "--data-dir", str(tmp_path), "--out", "--rejected", "--json")
    [rej] = [json.loads(x) for x in r.stdout.splitlines()]
    assert rej["reason"] == "reward-mismatch" and rej["peer"] == peer_id_to_b58(validator)
    assert rej["item"] == (b"\x01" * 32).hex()
    r = run_cli("ledger", "--data-dir", str(tmp_path), "--out", "--last", "2")
    listed = [x for x in r.stdout.splitlines() if not x.startswith("totals: ")]
    assert r.returncode == 0 and len(listed) == 2
    assert "rejected" in listed[-1] and "reward-mismatch" in r.stdout
    assert "totals: own work 5 produced, 0 delivered, 1 audited" in r.stdout
    r = run_cli("ledger", "--data-dir", str(tmp_path), "--in")
    assert "bad_signature" in r.stdout and "produced" not in r.stdout
    r = run_cli("ledger", "--data-dir", str(tmp_path / "none"))
    assert (
        r.returncode == 2
        and len(r.stderr.strip().splitlines()) == 1
        and "no node store" in r.stderr
    )
