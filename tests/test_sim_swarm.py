"""The simulator: determinism, lower bounds, byte conservation, churn, attackers.

Small scenarios (tens of peers, a few virtual minutes) so the file runs in well under a
minute; the same code paths run at scale in `swarm-node bench sim`.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from swarm_sim.adversary import AdversaryConfig, Behaviour
from swarm_sim.churn import ChurnConfig
from swarm_sim.network import NetConfig
from swarm_sim.runner import run_scenario
from swarm_sim.scenario import BUILTINS, Scenario, ScenarioError, load, parse
from swarm_sim.swarm import Swarm, Workload

SMALL = Workload(peers=30, duration_s=60, publish_interval_s=15)


def results_bytes(scn: Scenario, seed: int) -> bytes:
    results, _ = run_scenario(scn, seed)
    return json.dumps(results, sort_keys=True, indent=1).encode()


def test_same_seed_same_results_byte_for_byte():
    scn = Scenario(
        "det",
        workload=SMALL,
        churn=ChurnConfig(churn_per_hour=20, offline_mean_s=20),
        network=NetConfig(loss=0.01),
        adversary=AdversaryConfig(fractions={"spam": 0.05, "replay": 0.05}),
    )
    a, b, other = results_bytes(scn, 7), results_bytes(scn, 7), results_bytes(scn, 8)
    assert a == b
    assert a != other  # the seed matters, so the equality above means something


def test_no_delivery_before_its_lower_bound():
    sw = Swarm(SMALL, churn=ChurnConfig(churn_per_hour=20, offline_mean_s=20), seed=1)
    sw.run()
    m = sw.m
    assert m.deliveries > 500
    assert min(m.bound_ms) > 0  # a bound of zero would make this test vacuous
    assert all(a >= b - 1e-3 for a, b in zip(m.latency_ms, m.bound_ms, strict=True))
    assert all(a >= b - 1e-3 for a, b in zip(m.body_latency_ms, m.body_bound_ms, strict=True))
    assert m.early == 0
    # Some deliveries come close to their bound: the bound is not loose by construction.
    assert min(a / b for a, b in zip(m.latency_ms, m.bound_ms, strict=True)) < 1.5


def test_bytes_sent_equal_received_plus_dropped():
    sw = Swarm(
        SMALL,
        net=NetConfig(loss=0.02),
        churn=ChurnConfig(churn_per_hour=30, offline_mean_s=15, crash_fraction=1.0),
        seed=2,
    )
    sw.run()
    c = sw.net.c
    assert c.bytes_dropped > 0 and c.lost > 0 and c.dropped_offline > 0
    assert c.bytes_sent == c.bytes_received + c.bytes_dropped + c.in_flight_bytes
    assert sum(sw.net.sent) == c.bytes_sent
    assert sum(sw.net.received) == c.bytes_received


def test_offline_peers_receive_nothing(monkeypatch):
    sw = Swarm(SMALL, churn=ChurnConfig(churn_per_hour=40, offline_mean_s=20), seed=3)
    offline_deliveries = []
    handled = 0
    real = Swarm._receive

    def receive(self, b, a, msg):
        nonlocal handled
        handled += 1
        if not self.net.online[b]:
            offline_deliveries.append((self.loop.now, b))
        return real(self, b, a, msg)

    monkeypatch.setattr(Swarm, "_receive", receive)
    sw.run()
    assert sw.m.leaves > 3 and handled > 500
    assert sw.net.c.dropped_offline > 0  # messages did head for peers that left
    assert offline_deliveries == []
    assert sw.m.delivered_offline == 0


def test_network_drops_a_message_whose_receiver_left_on_the_way():
    from swarm_sim.core import EventLoop, derive_rng
    from swarm_sim.network import Network

    loop = EventLoop()
    net = Network(loop, NetConfig(jitter=0.0), 2, derive_rng(0, "n"))
    net.set_online(0, True)
    net.set_online(1, True)
    assert net.connect(0, 1)
    got = []
    net.send(0, 1, 1000, "x", got.append, ("first",))
    loop.run(10.0)
    net.send(0, 1, 1000, "x", got.append, ("second",))
    loop.at(loop.now + 1e-6, net.set_online, 1, False)
    loop.run(20.0)
    assert got == ["first"]
    assert net.c.bytes_sent == 2000 and net.c.bytes_received == 1000
    assert net.c.bytes_dropped == 1000


def test_a_fast_signer_is_dropped_free_and_never_banned():
    """Over its signer rate a producer's headers are dropped, never charged: a fast honest
    worker looks the same to its peers."""
    wl = Workload(peers=40, duration_s=60, publish_interval_s=20)
    sw = Swarm(wl, adversary=AdversaryConfig(fractions={"spam": 0.05}, spam_rate=60), seed=4)
    sw.run()
    assert sw.m.rejects["rate_limited"] > 0
    assert sw.m.bans == 0 and sw.m.honest_penalized == 0


def test_a_flooder_is_scored_out_of_meshes():
    """Past the per-connection rate and its overrun allowance a sender pays."""
    wl = Workload(peers=40, duration_s=120, publish_interval_s=20)
    sw = Swarm(wl, adversary=AdversaryConfig(fractions={"spam": 0.05}, spam_rate=200), seed=4)
    spammers = {p for p in range(sw.n) if sw.behaviour[p] == Behaviour.SPAM}
    assert len(spammers) == 2
    sw.run()
    slots = [s for _, s in sw.m.adversary_mesh]
    assert slots[1] > 0  # they were in meshes before misbehaving (t = 10 s)
    assert slots[-1] == 0
    for p in range(sw.n):
        if p not in spammers:
            assert not (sw.routers[p].mesh & spammers)
    assert sw.m.bans >= len(spammers)
    assert sw.m.rejects["rate_limited"] > 0
    fig = sw.summary()
    assert fig["bans_honest"] == 0 and fig["bans_attackers"] == sw.m.bans


def test_forged_messages_get_their_sender_banned_and_are_never_delivered():
    sw = Swarm(SMALL, adversary=AdversaryConfig(fractions={"invalid": 0.05}), seed=5)
    sw.run()
    assert sw.m.rejects["bad_signature"] > 0
    assert sw.m.bans > 0
    assert sw.m.honest_penalized == 0
    assert sw.summary()["delivery_ratio"] == 1.0
    assert sw.m.bans_honest == 0


def test_scenarios_parse_and_refuse_unknown_keys():
    assert set(BUILTINS) >= {"gossip-1k", "churn", "byzantine", "broadcast", "run"}
    for name in BUILTINS:
        assert load(name).name == name
    scn = parse('name = "x"\n[workload]\npeers = 12\n[gossip]\nd = 8\n')
    assert scn.workload.peers == 12 and scn.gossip.d == 8
    with pytest.raises(ScenarioError, match=r"workload\.peerz"):
        parse("[workload]\npeerz = 3\n")
    with pytest.raises(ScenarioError, match="D_lo <= D <= D_hi"):
        parse("[gossip]\nd = 20\n")
    with pytest.raises(ScenarioError, match="unknown table"):
        Scenario("x").replace(nope={})


def test_broadcast_finishes_no_faster_than_its_bound():
    from swarm_sim.broadcast import BroadcastConfig, simulate_broadcast

    r = simulate_broadcast(
        BroadcastConfig(peers=30, size_bytes=64_000_000, shard_bytes=8_000_000), NetConfig()
    )
    assert r["unfinished"] == 0
    assert r["completion_max_s"] >= r["lower_bound_s"] > 0
    assert r["star_s"] > r["lower_bound_s"]


def test_duplicated_work_costs_its_signer_and_no_honest_peer():
    sw = Swarm(SMALL, adversary=AdversaryConfig(fractions={"duplicate": 0.07}), seed=6)
    dups = {p for p in range(sw.n) if sw.behaviour[p] == Behaviour.DUPLICATE}
    sw.run()
    assert sw.m.rejects["double_work"] > 0
    assert sw.m.honest_penalized == 0
    for p in range(sw.n):
        if p not in dups:
            assert not (sw.routers[p].mesh & dups)


def test_counter_shoppers_are_charged_by_the_trainers_rule_and_honest_workers_are_not():
    """The trainer's dense-counter rule (`protocol.accounting.GapCharges`, the one the real
    trainer runs) in the simulator: shoppers publishing one counter in four are charged;
    honest producers are not, with churn and lost messages."""
    wl = Workload(peers=30, duration_s=240, publish_interval_s=5)
    sw = Swarm(
        wl,
        net=NetConfig(loss=0.01),
        churn=ChurnConfig(churn_per_hour=20.0, offline_mean_s=20.0),
        adversary=AdversaryConfig(fractions={"shop": 0.1}, shop_keep=0.25),
        seed=7,
    )
    out = sw.run()["gap_charges"]
    assert out["shoppers"] >= 2
    assert out["shoppers_charged"] == out["shoppers"]
    assert out["honest_charged"] == 0 and out["others_charged"] == 0


def test_a_cold_swarm_delivers_every_header_and_so_does_a_warm_one():
    """At a cold start every signer is new to every peer; a young view takes them all
    (`AdmissionConfig.young_view_signers`), and peers that restored the signers they knew
    (the node's restart path) need no allowance. With the young allowance off, the running
    view's new-identity rates refuse some."""
    wl = Workload(peers=60, duration_s=40, publish_interval_s=10, warm_start=False)
    cold = Swarm(wl, seed=3)
    cold_fig = cold.run()
    warm = Swarm(dataclasses.replace(wl, warm_start=True), seed=3)
    warm_fig = warm.run()
    no_young = dataclasses.replace(wl.admission, young_view_signers=0)
    closed = Swarm(dataclasses.replace(wl, admission=no_young), seed=3)
    closed_fig = closed.run()
    assert cold.m.rejects.get("new_identities", 0) == 0
    assert cold_fig["delivery_ratio"] == 1.0
    assert warm.m.rejects.get("new_identities", 0) == 0
    assert warm_fig["delivery_ratio"] == 1.0
    assert closed.m.rejects.get("new_identities", 0) > 0
    assert closed_fig["delivery_ratio"] < 1.0


def test_a_replayer_is_the_author_of_its_replays_and_pays_for_them():
    """A replay is a new gossip message of the replayer's carrying another key's header:
    its publisher (`from`) reaches admission as the origin, so the replayer pays for what
    admission refuses (here: headers signed too long ago), as the real node's rule says;
    honest relays of the same header pay nothing."""
    sw = Swarm(
        Workload(peers=40, duration_s=300, publish_interval_s=10, warm_start=True),
        adversary=AdversaryConfig(fractions={"replay": 0.1}),
        seed=4,
    )
    fig = sw.run()
    replayers = [p for p in range(sw.n) if sw.behaviour[p] == Behaviour.REPLAY]
    assert replayers and sw.m.rejects.get("clock_skew", 0) > 0
    now = sw.loop.now
    for p in replayers:
        assert sum(a.scores.score(sw.ids[p], now) for a in sw.adm) < 0
    assert fig["honest_penalized"] == 0


def test_a_burst_publishes_generation_batches_at_the_same_mean_rate():
    """`burst = 4`: a worker publishes 4 rollouts at once every 4 intervals (an inference
    batch), as the real bench gossip's producers do; the count is the same as one per
    interval, the signing times come in groups."""
    one = Swarm(Workload(peers=10, duration_s=40, publish_interval_s=5, warm_start=True), seed=5)
    four = Swarm(dataclasses.replace(one.wl, burst=4), seed=5)
    t_one, t_four = [], []
    for sw, times in ((one, t_one), (four, t_four)):
        publish = sw.publish

        def record(p, _publish=publish, _times=times, _sw=sw, **kw):  # type: ignore[no-untyped-def]
            _times.append(_sw.loop.now)
            return _publish(p, **kw)

        sw.publish = record  # type: ignore[method-assign]
        sw.run()
    assert len(t_one) == len(t_four) > 0
    assert len(set(t_four)) * 4 == len(t_four)  # four at each instant
    assert len(set(t_one)) > len(set(t_four))
