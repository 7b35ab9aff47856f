"""`bench adversary`'s figures from the peers' reports (no processes): who counts as
penalized, and what `changed_model`'s rejected_fraction is over."""

from __future__ import annotations

from typing import Any

from protocol.identity import Identity
from swarm_node_bench import adversary

KEYS = {
    name: Identity.from_private_bytes(bytes([i + 1]) * 32)
    for i, name in enumerate(("trainer", "validator", "w1", "w2"))
}
ATTACKER = "attacker-peer"


def reports(
    signers: list[str],
    *,
    banned_in_standing: list[str],
    scores: dict[str, float],
    trained: dict[str, list[str]],
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    t_rep = {
        "verified": {},
        "trained": trained,
        "made": {},
        "banned_producers": banned_in_standing,
        "admitted_by_signer": {},
        "usable": {},
        "credit": {},
        "counted_reward": {},
        "admitted_ahead": {},
        "double_counted": 0,
    }
    v_rep = {"sampled": [], "standing_banned": []}
    view = {"scores": scores, "banned": {}}
    return t_rep, v_rep, [view, view]


def figures(run: dict[str, Any], t_rep, v_rep, views) -> dict[str, Any]:
    run = {"attacker": ATTACKER, "window": (0.0, 1.0), **run}
    return adversary.figures({"case": run}, t_rep, v_rep, views, KEYS, (0.0, 1.0), 1.0)["attacks"][
        "case"
    ]


def test_an_attacker_relaying_for_keys_that_are_all_banned_is_penalized() -> None:
    keys = [f"key{i}" for i in range(6)]
    run = {"signers": keys, "measure": "trained", "sent": 48}
    all_banned = reports(keys, banned_in_standing=keys, scores={ATTACKER: 1.0}, trained={})
    assert figures(run, *all_banned)["attacker_penalized"]
    one_left = reports(keys, banned_in_standing=keys[:-1], scores={ATTACKER: 1.0}, trained={})
    assert not figures(run, *one_left)["attacker_penalized"]
    scored_down = reports(
        keys, banned_in_standing=keys[:-1], scores={ATTACKER: 1.0, keys[-1]: -3.0}, trained={}
    )
    assert figures(run, *scored_down)["attacker_penalized"]


def test_changed_model_rejected_fraction_counts_only_the_changed_records() -> None:
    probation = [f"h{i}" for i in range(48)]
    changed = [f"c{i}" for i in range(128)]
    run = {"signers": ["cheat"], "measure": "trained", "sent": 176, "changed_ids": changed}
    rep = reports(
        ["cheat"],
        banned_in_standing=["cheat"],
        scores={},
        trained={"cheat": probation + changed[:16]},
    )
    out = figures(run, *rep)
    assert out["rejected_fraction"] == round(1 - 16 / 128, 4)
