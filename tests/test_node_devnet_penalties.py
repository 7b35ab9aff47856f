"""The devnet report lists every penalty its nodes charged, read from their stores, and
says which were against the devnet's own (honest) nodes."""

from __future__ import annotations

import time
from pathlib import Path

from node.commands.devnet import NodeProc
from node.commands.devnet_report import penalties, penalty_lines
from node.store.store import Store
from protocol.admission import Reason, Reject, Stage
from protocol.identity import Identity


def _node(root: Path, name: str, ident: Identity) -> NodeProc:
    return NodeProc(
        name,
        "relay",
        root / name,
        proc=None,
        log=root / name / "log",  # type: ignore[arg-type]
        peer_id=ident.peer_id_b58,
    )


def test_penalties_are_grouped_with_reason_and_honest_nodes_named(tmp_path: Path) -> None:
    a, b, stranger = Identity.generate(), Identity.generate(), Identity.generate()
    na, nb = _node(tmp_path, "trainer", a), _node(tmp_path, "validator1", b)
    now = time.time()
    with Store.open(na.dir / "data") as store:
        store.log_rejects(
            [
                (
                    Reject(
                        b.peer_id_b58,
                        Reason.FLOODING,
                        -1.0,
                        Stage.DEDUP,
                        "already admitted as rollout_header",
                        "rollout_header",
                    ),
                    now,
                ),
                (
                    Reject(
                        b.peer_id_b58, Reason.FLOODING, -1.0, Stage.DEDUP, "again", "rollout_header"
                    ),
                    now,
                ),
                (
                    Reject(
                        stranger.peer_id_b58,
                        Reason.BAD_SIGNATURE,
                        -5.0,
                        Stage.SIGNATURE,
                        "bad",
                        "verdict",
                    ),
                    now,
                ),
            ]
        )
    nb.dir.mkdir(parents=True)  # a node without a store yet is skipped
    found = penalties([na, nb])
    assert found[0] == {
        "by": "trainer",
        "peer": "validator1",
        "honest": True,
        "reason": "flooding",
        "kind": "rollout_header",
        "count": 2,
        "detail": "dedup: already admitted as rollout_header",
    }
    assert found[1]["peer"] == stranger.peer_id_b58 and not found[1]["honest"]
    lines = penalty_lines(found)
    assert (
        lines[0]
        == "devnet: penalties: 3 charged, 2 of them against the devnet's own (honest) nodes"
    )
    assert "trainer charged validator1 2x flooding" in lines[1]
