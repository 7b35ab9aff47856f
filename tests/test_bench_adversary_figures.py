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


def test_honest_penalty_counts_what_honest_keys_lost_during_the_case_only() -> None:
    """Charges of honest keys (and the case's victims) at honest peers between the case's
    start and the next case's; the attacker's own charges and other cases' do not count."""
    w1 = KEYS["w1"].peer_id_b58
    run = {"signers": [], "measure": "gain", "sent": 1, "victims": ["victim"], "until": 2.0}
    run["truth_by_signer"] = {"victim": {0: 1.0}}
    t_rep, v_rep, views = reports([], banned_in_standing=[], scores={}, trained={})
    clean = [{**v, "charges": {ATTACKER: [(0.5, -10.0)], w1: [(3.0, -1.0)]}} for v in views]
    assert figures(run, t_rep, v_rep, clean)["honest_penalty"] == 0
    paid = [{**v, "charges": {"victim": [(0.5, -2.5)]}} for v in views]
    assert figures(run, t_rep, v_rep, paid)["honest_penalty"] == -5.0  # at both views


def test_credit_gain_is_credited_per_accounted_counter_over_true_worth_per_counter_made() -> None:
    """Key shopping's figure: keys credited 0.5 (probation) of their own mean 1.0, whose
    counters were truly worth 0.25 on average (the abandoned, unpublished ones at 0)."""
    keys = ["k0", "k1"]
    run = {"signers": keys, "measure": "gain", "sent": 2}
    run["truth_by_signer"] = {k: {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0} for k in keys}
    t_rep, v_rep, views = reports(keys, banned_in_standing=[], scores={}, trained={})
    t_rep["credit"] = {k: {"credited": 0.5, "held": 1} for k in keys}
    assert figures(run, t_rep, v_rep, views)["credit_gain"] == 2.0
    t_rep["credit"] = {k: {"credited": 0.0, "held": 1} for k in keys}
    assert figures(run, t_rep, v_rep, views)["credit_gain"] == 0.0


def test_a_quick_run_too_short_to_judge_reports_no_honest_trained_fraction() -> None:
    """Fewer than 90% of the honest records made in the case's window held as bodies by the
    trainer at the report: in a quick run, trained-or-not says nothing (None)."""
    w1 = KEYS["w1"].peer_id_b58
    t_rep, v_rep, views = reports([], banned_in_standing=[], scores={}, trained={w1: ["a"]})
    t_rep["made"] = {"a": (w1, 0.5), "b": (w1, 0.6)}
    t_rep["bodies"] = ["a"]
    run = {"attacker": ATTACKER, "window": (0.0, 1.0), "signers": [], "measure": "gain"}
    run["sent"] = 1

    def fraction(quick: bool) -> float | None:
        out = adversary.figures(
            {"case": run}, t_rep, v_rep, views, KEYS, (0.0, 1.0), 1.0, quick=quick
        )
        return out["attacks"]["case"]["honest_trained_fraction"]

    assert fraction(quick=False) == 0.5 and fraction(quick=True) is None
    t_rep["bodies"] = ["a", "b"]
    assert fraction(quick=True) == 0.5
