"""A worker sees what its work became: `Store.own_work` splits its rollouts into produced,
delivered, audited, refused, trained, too stale, awaiting audit and trained unaudited;
`status` prints that and the role's own figures as text; `ledger` ends with the totals and
says when retention compacted lines into them."""

from __future__ import annotations

import json
import time

from node.commands.status import role_lines
from node.metrics import render
from node.store.store import DB_FILENAME, LedgerEntry, RolloutRow, Store
from protocol.identity import Identity
from tests.support.cli import run_cli

TRAINER = Identity.from_private_bytes(bytes(range(32))).peer_id
VALIDATOR = Identity.from_private_bytes(bytes(range(5, 37))).peer_id
T0 = time.time() - 1000


def _rid(i: int) -> bytes:
    return i.to_bytes(32, "big")


def _worker_store(path) -> None:
    """Eight own rollouts: 0-5 at version 1, 6-7 at version 9; verdicts on 0 (pass) and 1
    (fail); 0-4 and 6 delivered; 5 too stale; the row of 4 dropped by retention."""
    with Store.open(path) as store:
        for i in range(8):
            store.put_produced(
                RolloutRow(_rid(i), "run", b"me", 1 if i < 6 else 9, b"h%d" % i, b"b", T0 + i)
            )
        for i, outcome in ((0, "accepted"), (1, "rejected")):
            store.log(LedgerEntry(T0 + 20, "out", outcome, "rollout", _rid(i), VALIDATOR, "why"))
        store.mark_delivered([_rid(i) for i in (0, 1, 2, 3, 4, 6)], TRAINER, T0 + 30)
        store.mark_too_stale([_rid(5)], "no trainer holds it", T0 + 40)
        with store._write() as c:  # retention drops a delivered row past its window
            c.execute("DELETE FROM rollouts WHERE rollout_id=?", (_rid(4),))


def test_own_work_splits_what_was_pending(tmp_path):
    _worker_store(tmp_path)
    with Store(tmp_path / DB_FILENAME) as store:
        at_version_10 = store.own_work(10, 2)
        unknown_version = store.own_work()
    assert at_version_10 == {
        "produced": 8,
        "delivered": 6,
        "audited": 2,
        "refused": 1,
        "trained": 4,  # 0 (passed), 2, 3, 4 (unaudited, window closed); not 1 (refused)
        "too_stale": 1,
        "awaiting_audit": 2,  # 6 and 7: version 9, still in the window at version 10
        "trained_unaudited": 3,
    }
    # Without the current version only a dropped row tells that its window closed.
    assert unknown_version["trained_unaudited"] == 1
    assert unknown_version["awaiting_audit"] == 4


def test_status_text_shows_own_work_and_the_role_section(tmp_path):
    _worker_store(tmp_path)
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "pid": 999_999_999,
                "time": time.time() - 60,
                "stopped": True,
                "policy_version": 10,
                "max_staleness": 2,
                "role_status": {
                    "produced": 8,
                    "reward_mean": 0.25,
                    "fates": {"trained": 4, "stale": 1},
                    "learning": [{"version": 0, "solve_rate": 0.2}],
                },
            }
        )
    )
    r = run_cli("status", "--data-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "role            produced=8, reward_mean=0.25" in out, out
    assert "fates         trained=4, stale=1" in out, out
    assert "learning      1 points" in out, out
    assert (
        "own work        8 produced, 6 delivered, 2 audited, 4 trained, 1 too stale, 1 refused"
        in out
    ), out
    assert "2 awaiting audit, 3 trained unaudited" in out, out
    assert "pending" not in out, out


def test_role_lines_skip_an_empty_role():
    assert role_lines(None) == [] and role_lines({}) == []


def test_ledger_shows_totals_and_says_lines_were_compacted(tmp_path):
    sender = Identity.generate().peer_id
    with Store.open(tmp_path) as store:
        for i in range(5):
            store.log(
                LedgerEntry(T0, "in", "rejected", "rollout_header", _rid(i), sender, "malformed")
            )
        store.enforce_retention(time.time(), below_version=0, keep_s=0)
        assert sum(store.ledger_compacted().values()) == 5
    r = run_cli("ledger", "--data-dir", str(tmp_path), "--in")
    assert r.returncode == 0, r.stderr
    assert "no lines match" in r.stdout, r.stdout
    assert "totals: received 5 rejected (5 older lines compacted" in r.stdout, r.stdout


def test_metrics_show_every_state_of_own_work():
    text = render({"delivery": {"produced": 8, "trained": 4, "trained_unaudited": 3}})
    assert 'swarm_delivery{state="trained"} 4' in text
    assert 'swarm_delivery{state="trained_unaudited"} 3' in text
