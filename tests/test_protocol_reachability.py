"""`protocol.reachability`: whom AutoNAT asks (at random, one per subnet) and the verdict by
agreement (a proven dial-back decides and convicts the contradicting answers; otherwise a
quorum must agree before the verdict changes)."""

from __future__ import annotations

import random

from protocol import reachability as r


def _liars_and_honest() -> list[tuple[str, str | None]]:
    # ids ground to sort first, all from one network; honest peers on their own networks
    liars = [(f"0000liar{i}", f"203.0.113.{10 + i}") for i in range(3)]
    honest = [(f"zzzzhonest{i}", f"198.51.{100 + i}.7") for i in range(4)]
    return liars + honest


def test_one_peer_per_subnet_is_asked_whatever_the_ids() -> None:
    for seed in range(50):
        chosen = r.pick_servers(_liars_and_honest(), random.Random(seed))
        assert len(chosen) == 5
        assert sum(p.startswith("0000liar") for p in chosen) == 1
    firsts = {r.pick_servers(_liars_and_honest(), random.Random(s))[0] for s in range(50)}
    assert len(firsts) > 2  # not in id order
    assert r.subnet("2001:db8:1:2::5") == r.subnet("2001:db8:1:ffff::1") != r.subnet("2001:db9::1")
    assert r.subnet(None) == r.subnet("garbage") == "?"


def test_a_proven_dial_back_decides_and_convicts_the_contradicting_answers() -> None:
    round_ = r.Round(("l1", "l2", "l3", "h"), r.PUBLIC)
    for liar in ("l1", "l2", "l3"):
        round_.answer(r.Answer(liar, reachable=False))
    round_.answer(r.Answer("h", reachable=True, proven=True))
    round_.answer(r.Answer("stranger", reachable=False))  # not asked: ignored
    out = round_.finish()
    assert out.verdict == r.PUBLIC and out.proven == 1 and out.answered == 4
    assert sorted(c.peer for c in out.charges) == ["l1", "l2", "l3"]


def test_without_proof_the_verdict_changes_only_on_a_quorum() -> None:
    lone = r.Round(("l1", "a", "b"), r.PUBLIC)  # one liar, two peers that never answered
    lone.answer(r.Answer("l1", reachable=False))
    out = lone.finish()
    assert out.verdict == r.PUBLIC and not out.charges
    split = r.Round(("a", "b", "c", "d"), r.UNKNOWN)
    for peer, says in (("a", False), ("b", False), ("c", False), ("d", True)):
        split.answer(r.Answer(peer, reachable=says))
    assert split.finish().verdict == r.PRIVATE  # three of four agree, none proven
    tie = r.Round(("a", "b", "c", "d", "e", "f"), r.PRIVATE)
    for peer, says in zip("abcdef", (False, False, False, True, True, True), strict=True):
        tie.answer(r.Answer(peer, reachable=says))
    assert tie.finish().verdict == r.PRIVATE  # no majority: kept
    single = r.Round(("only",), r.UNKNOWN)  # a run with one bootstrap: its answer decides
    single.answer(r.Answer("only", reachable=False))
    assert single.finish().verdict == r.PRIVATE
