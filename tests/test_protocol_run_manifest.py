"""Run releases (`protocol.run_manifest`): each way to pass off a manifest the run's
authority did not release, or an outdated one, is refused with its reason."""

from __future__ import annotations

import dataclasses

import pytest

from protocol import run_manifest as rm
from protocol.codec import decode, encode
from protocol.envelope import seal
from protocol.identity import Identity
from protocol.wire import DatasetSpec, Envelope, RunManifest, RunRelease

AUTHORITY = Identity.from_private_bytes(bytes(range(10, 42)))
MALLORY = Identity.from_private_bytes(bytes(range(11, 43)))
T_MS = 1_700_000_000_000


def manifest(run_id: str = "demo", seed: int = 1) -> RunManifest:
    return RunManifest(
        run_id=run_id,
        model="builtin:tiny",
        model_digest=b"",
        datasets=(DatasetSpec(name="basic_arithmetic", weight=1),),
        seed=seed,
        group_size=4,
        max_staleness=2,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        proof_chunk=32,
        proof_topk=128,
        trainer_keys=(),
    )


def release(version: int = 1, by: Identity = AUTHORITY, **kw) -> bytes:
    return rm.seal_release(by, manifest(**kw), version, T_MS)


def held(version: int) -> RunRelease:
    return decode(RunRelease, decode(Envelope, release(version)).payload)


def test_a_release_by_the_pinned_authority_is_adopted():
    verdict = rm.check(release(3), AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Adopt)
    assert verdict.release.manifest_version == 3 and not verdict.first_use
    assert verdict.release.manifest == manifest()


def test_nothing_pinned_is_trust_on_first_use():
    verdict = rm.check(release(1), None, None)
    assert isinstance(verdict, rm.Adopt) and verdict.first_use
    assert verdict.release.authority == AUTHORITY.peer_id


def test_foreign_signed_is_refused():
    verdict = rm.check(release(1, by=MALLORY), AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.FOREIGN


def test_once_adopted_only_the_same_authority_may_update():
    verdict = rm.check(release(5, by=MALLORY), None, held(1))
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.FOREIGN


@pytest.mark.parametrize("offered, holding", [(1, 1), (1, 2)])
def test_older_or_equal_version_is_refused(offered, holding):
    verdict = rm.check(release(offered), AUTHORITY.peer_id, held(holding))
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.NOT_NEWER


def test_newer_version_is_adopted():
    verdict = rm.check(release(2, seed=7), AUTHORITY.peer_id, held(1))
    assert isinstance(verdict, rm.Adopt) and verdict.release.manifest.seed == 7


def test_a_release_of_another_run_is_refused():
    verdict = rm.check(release(2, run_id="other"), AUTHORITY.peer_id, held(1))
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.OTHER_RUN


@pytest.mark.parametrize("data", [b"", None])
def test_nothing_served_is_unsigned(data):
    verdict = rm.check(data, None, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.UNSIGNED


def test_a_bare_manifest_is_unsigned():
    verdict = rm.check(rm.encode_unsigned(manifest()), None, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.UNSIGNED


def test_a_tampered_release_has_a_bad_signature():
    env = decode(Envelope, release(1))
    other = RunRelease(manifest=manifest(seed=99), manifest_version=1, authority=AUTHORITY.peer_id)
    forged = encode(dataclasses.replace(env, payload=encode(other)))
    verdict = rm.check(forged, AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.BAD_SIGNATURE


def test_a_release_naming_another_authority_than_its_signer_is_foreign():
    inner = RunRelease(manifest=manifest(), manifest_version=1, authority=AUTHORITY.peer_id)
    data = seal(MALLORY, inner, run_id="demo", policy_version=0, seq=1, timestamp_ms=T_MS)
    verdict = rm.check(data, None, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.FOREIGN


@pytest.mark.parametrize("data", [b"\x00" * 40, b"\x93\x01\x02\x03", bytes(range(256))])
def test_garbage_is_malformed(data):
    verdict = rm.check(data, None, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.MALFORMED


def test_a_signed_bare_manifest_is_not_a_release():
    data = seal(AUTHORITY, manifest(), run_id="demo", policy_version=0, seq=1, timestamp_ms=T_MS)
    verdict = rm.check(data, AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.MALFORMED


def test_envelope_sequence_must_be_the_manifest_version():
    inner = RunRelease(manifest=manifest(), manifest_version=2, authority=AUTHORITY.peer_id)
    data = seal(AUTHORITY, inner, run_id="demo", policy_version=0, seq=9, timestamp_ms=T_MS)
    verdict = rm.check(data, AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.MALFORMED


def test_pin_table():
    a, b = AUTHORITY.peer_id, MALLORY.peer_id
    assert rm.choose_pin(None, None) == rm.Pin(None)
    assert rm.choose_pin(a, None) == rm.Pin(a)
    assert rm.choose_pin(None, a) == rm.Pin(a)
    assert rm.choose_pin(a, a) == rm.Pin(a)
    refused = rm.choose_pin(b, a)
    assert isinstance(refused, rm.Refuse) and refused.reason == rm.FOREIGN


def test_after_first_use_a_different_key_is_refused():
    first = rm.check(release(1), None, None)
    assert isinstance(first, rm.Adopt) and first.first_use
    pin = rm.choose_pin(None, first.release.authority)
    later = rm.check(release(1, by=MALLORY), pin.authority, None)
    assert isinstance(later, rm.Refuse) and later.reason == rm.FOREIGN


def test_a_release_kept_in_parts_reassembles_to_the_same_bytes():
    data = release(4)
    version, authority, ts, sig = rm.parts(data)
    assert rm.assemble(manifest(), version, authority, ts, sig) == data
    edited = rm.assemble(manifest(seed=5), version, authority, ts, sig)
    verdict = rm.check(edited, AUTHORITY.peer_id, None)
    assert isinstance(verdict, rm.Refuse) and verdict.reason == rm.BAD_SIGNATURE
