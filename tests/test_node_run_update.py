"""A run update reaches running peers: two real py-libp2p peers on 127.0.0.1, one holding
release 1 of a run, the other release 2 naming a new validator key. On connecting, the
older peer adopts release 2 (the new validator may judge at once, its file is kept); offered
release 1 again, either refuses it as not newer, and a release by another key as foreign."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import trio

from node.peer.peer import open_peer
from node.peer.run_service import RELEASE_FILE, RunService
from node.testing.records import net_manifest
from protocol import run_manifest as rm
from protocol.identity import Identity
from tests.support.peers import relay_config
from tests.support.polling import until

pytestmark = pytest.mark.network


async def test_a_newer_release_is_adopted_live_and_an_older_one_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="swarm.run")
    authority, validator = Identity.generate(), Identity.generate()
    v1_manifest = net_manifest("live-update")
    v2_manifest = dataclasses.replace(v1_manifest, validator_keys=(validator.peer_id,))
    v1 = rm.seal_release(authority, v1_manifest, 1, 1_700_000_000_000)
    v2 = rm.seal_release(authority, v2_manifest, 2, 1_700_000_001_000)
    async with open_peer(relay_config(tmp_path, "old", v1_manifest)) as old:
        old_service = RunService(old, v1, authority.peer_id)
        assert not old.admission.authority.may_judge(validator.peer_id)
        new_cfg = relay_config(
            tmp_path, "new", v2_manifest, bootstrap=(old.host.listen_addrs()[0],)
        )
        async with open_peer(new_cfg) as new:
            new_service = RunService(new, v2, authority.peer_id)
            await until(
                "the old peer adopts release 2",
                lambda: (
                    old_service.release is not None and old_service.release.manifest_version == 2
                ),
            )
            assert old.admission.authority.may_judge(validator.peer_id)
            assert old_service.data == v2 and (tmp_path / "old" / RELEASE_FILE).read_bytes() == v2
            for service in (old_service, new_service):
                assert service.consider(v1, "someone").reason == rm.NOT_NEWER
                forged = rm.seal_release(Identity.generate(), v2_manifest, 3, 1_700_000_002_000)
                assert service.consider(forged, "someone").reason == rm.FOREIGN
                assert service.release.manifest_version == 2 and service.data == v2
            await trio.sleep(0)
    assert "not newer: version 1, we hold 2" in caplog.text and "foreign-signed" in caplog.text


async def test_a_garbage_run_directory_request_costs_its_sender_and_breaks_nothing(
    tmp_path: Path,
) -> None:
    from node.exchange import runs as run_exchange

    authority = Identity.generate()
    manifest = net_manifest("garbage")
    release = rm.seal_release(authority, manifest, 1, 1_700_000_000_000)
    async with open_peer(relay_config(tmp_path, "server", manifest)) as server:
        RunService(server, release, authority.peer_id)
        async with open_peer(relay_config(tmp_path, "client", manifest)) as client:
            result = await client.host.connect(server.host.listen_addrs()[0])
            assert result.ok
            stream = await client.host.open_stream(server.host.peer_id, run_exchange.PROTOCOL_ID)
            await stream.send(b"\xc1garbage")
            await until(
                "the server charges the bad request", lambda: server.rejects["bad_request"] >= 1
            )
            # an honest question on a new stream is still answered
            [served] = await run_exchange.fetch_runs(client.host, server.host.peer_id)
            assert served.release == release and served.summary["run"] == "garbage"


def _bad_signature(release: bytes) -> bytes:
    """`release` with one bit of its signature flipped."""
    from protocol.codec import decode, encode
    from protocol.wire import Envelope

    env = decode(Envelope, release)
    signature = bytes([env.signature[0] ^ 1]) + env.signature[1:]
    return encode(dataclasses.replace(env, signature=signature))


async def test_a_peer_serving_a_bad_signature_release_is_charged_as_a_forger(
    tmp_path: Path,
) -> None:
    import time

    from protocol import penalties

    authority = Identity.generate()
    manifest = net_manifest("forged-sig")
    v1 = rm.seal_release(authority, manifest, 1, 1_700_000_000_000)
    v2 = rm.seal_release(authority, manifest, 2, 1_700_000_001_000)
    assert rm.check(_bad_signature(v2), authority.peer_id, None).reason == rm.BAD_SIGNATURE
    async with open_peer(relay_config(tmp_path, "forger", manifest)) as forger:
        forging = RunService(forger, v1, authority.peer_id)
        forging.data = _bad_signature(v2)  # serves a "version 2" whose signature fails
        cfg = relay_config(tmp_path, "honest", manifest, bootstrap=(forger.host.listen_addrs()[0],))
        async with open_peer(cfg) as honest:
            service = RunService(honest, v1, authority.peer_id)
            scores = honest.admission.scores
            who = forger.host.peer_id
            await until(
                "the forger is charged for the bad signature",
                lambda: scores.score(who, time.time()) <= penalties.BAD_SIGNATURE.cost / 2,
            )
            assert service.counters["run_release_refused_bad_signature"] >= 1
            assert service.release is not None and service.release.manifest_version == 1
            # a foreign-signed release (another run's authority) is refused, not charged
            before = scores.score("someone-else", time.time())
            foreign = rm.seal_release(Identity.generate(), manifest, 3, 1_700_000_002_000)
            assert service.consider(foreign, "someone-else").reason == rm.FOREIGN
            await trio.sleep(0.1)
            assert scores.score("someone-else", time.time()) == before
