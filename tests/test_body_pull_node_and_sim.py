"""A producer that withholds its bodies costs the same in the node and in the simulator:
both drive `protocol.body_pull`, and admission judges what the schedule gives up on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from node.exchange import rollouts as rollout_exchange
from node.host.host import HostSettings
from node.peer.peer import PeerConfig, open_peer
from node.testing.records import net_manifest, synthetic_record
from protocol import body_pull as bp
from protocol.admission import AdmissionConfig, Reason
from protocol.codec import decode
from protocol.identity import Identity
from protocol.wire import RolloutRecord
from swarm_sim.adversary import AdversaryConfig, Behaviour
from swarm_sim.swarm import Swarm, Workload

PULL = bp.PullConfig(attempts=2, retry_s=0.2, retry_max_s=0.2)
NO_REWARD = AdmissionConfig(admit_reward=0.0)
BODY_MISSING = NO_REWARD.penalties[Reason.BODY_MISSING]


def _sim_charges() -> list[float]:
    """Score changes of a withholding producer at the trainer, one per given-up pull."""
    wl = Workload(
        peers=4,
        duration_s=40,
        publish_interval_s=10,
        pullers=0.0,
        connect_to=3,
        pull_tries=PULL.attempts,
        warm_start=True,
        admission=AdmissionConfig(admit_reward=0.0, dedup_entries=4096),
    )
    sw = Swarm(wl, adversary=AdversaryConfig(fractions={"withhold": 0.25}, start_s=0.0), seed=3)
    (withholder,) = [p for p in range(sw.n) if sw.behaviour[p] == Behaviour.WITHHOLD]
    charges: list[float] = []
    body_missing = sw._body_missing

    def measured(b: int, sender: int, msg, signer: bytes, answered: int) -> None:  # type: ignore[no-untyped-def]
        before = sw.adm[b].scores.score(signer, sw.loop.now)
        body_missing(b, sender, msg, signer, answered)
        if b == 0 and sw.index[signer] == withholder:
            charges.append(sw.adm[b].scores.score(signer, sw.loop.now) - before)

    sw._body_missing = measured  # type: ignore[method-assign]
    sw.run()
    return charges


def test_the_simulator_charges_a_silent_withholder_once_per_header() -> None:
    charges = _sim_charges()
    assert charges, "the trainer gave up on none of the withholder's bodies"
    assert charges == pytest.approx([BODY_MISSING] * len(charges), abs=1e-6)


@pytest.mark.network
async def test_the_node_charges_a_silent_withholder_as_the_simulator_does(tmp_path: Path) -> None:
    manifest = net_manifest("withhold")
    settings = HostSettings(io_timeout_s=0.5)

    def cfg(name: str, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
        return PeerConfig(
            manifest=manifest,
            identity=Identity.generate(),
            data_dir=tmp_path / name,
            roles=("relay",),
            host=settings,
            admission=NO_REWARD,
            pull=PULL,
            **kw,
        )

    async def silent(stream) -> None:  # type: ignore[no-untyped-def]
        await trio.sleep(30)  # holds the stream open and answers nothing

    async with (
        open_peer(cfg("t")) as t,
        open_peer(cfg("w", pull_bodies=False, bootstrap=(t.host.listen_addrs()[0],))) as w,
    ):
        w.host.set_stream_handler(rollout_exchange.protocol_id(manifest.run_id), silent)
        await w.host.wait_for_topic_peers(w.topics["rollouts"], 1, 10)
        header = decode(
            RolloutRecord, synthetic_record(w.identity, manifest, 0, n_completion=16)
        ).header
        with trio.fail_after(20):
            while t.counters["in_rollout_header"] < 1:
                await w.host.publish(w.topics["rollouts"], header)
                await trio.sleep(0.5)
        before = t.admission.scores.score(w.identity.peer_id_b58, time.time())
        with trio.fail_after(20):
            while t.counters["pull_gave_up"] < 1:
                await trio.sleep(0.1)
        after = t.admission.scores.score(w.identity.peer_id_b58, time.time())
    assert after - before == pytest.approx(BODY_MISSING, abs=0.01)
    assert _sim_charges()[0] == pytest.approx(after - before, abs=0.01)
