"""Run releases on disk and on the wire, without a network: `run sign`, the `[release]`
section of a run file, the run directory answer's shape, and the words for a failed dial."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from node import join
from node.commands import run_sign
from node.errors import CommandError
from node.exchange import runs as run_exchange
from node.keyfile import write_key
from node.model_fetch import read_bundle_files
from node.run_file import load_run_release, manifest_to_toml
from node.testing.records import net_manifest
from protocol import run_manifest as rm
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.model_bundle import encode_bundle
from tests.support.devnet_model import small_run_file
from trainer.checkpoint import from_model_dir


def _keys(tmp: Path) -> tuple[Path, Path]:
    a, b = tmp / "a.key", tmp / "b.key"
    write_key(a, Identity.generate())
    write_key(b, Identity.generate())
    return a, b


def test_sign_then_load_gives_a_checked_release_and_versions_rise(tmp_path: Path) -> None:
    a, _ = _keys(tmp_path)
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(net_manifest("demo")))
    assert load_run_release(run)[1] is None  # unsigned
    run_sign.main(run, a)
    manifest, data = load_run_release(run)
    verdict = rm.check(data, None, None)
    assert isinstance(verdict, rm.Adopt) and verdict.release.manifest == manifest
    assert verdict.release.manifest_version == 1
    run_sign.main(run, a)
    assert rm.parts(load_run_release(run)[1])[0] == 2
    assert run.read_text().count("[release]") == 1
    with pytest.raises(CommandError, match="must be above"):
        run_sign.main(run, a, version=2)


def test_a_file_edited_after_signing_is_refused(tmp_path: Path) -> None:
    a, _ = _keys(tmp_path)
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(net_manifest("demo")))
    run_sign.main(run, a)
    run.write_text(run.read_text().replace("seed = ", "seed = 9", 1))
    with pytest.raises(CommandError, match="bad signature"):
        load_run_release(run)


def test_signing_another_authoritys_release_is_refused(tmp_path: Path) -> None:
    a, b = _keys(tmp_path)
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(net_manifest("demo")))
    run_sign.main(run, a)
    with pytest.raises(CommandError, match="refuse a release signed by another key"):
        run_sign.main(run, b)


def test_without_release_keeps_every_other_table() -> None:
    text = '[run]\nid = "x"\n\n[release]\nversion = 1\n\n[[datasets]]\nname = "a"\n'
    out = run_sign.without_release(text)
    assert "[release]" not in out and "version = 1" not in out
    assert "[run]" in out and "[[datasets]]" in out and 'name = "a"' in out


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xc1",
        msgpack.packb({"a": 1}),
        msgpack.packb([[b"x"]]),
        msgpack.packb([[b"x", {"run": 1}]]),
        msgpack.packb(
            [
                [
                    b"x",
                    {
                        "run": "r",
                        "model": "m",
                        "policy_version": True,
                        "manifest_version": 0,
                        "authority": "",
                        "peers": {},
                        "time_ms": 0,
                    },
                ]
            ]
        ),
    ],
)
def test_a_malformed_run_directory_answer_is_refused(garbage: bytes) -> None:
    with pytest.raises(run_exchange.BadResponse):
        run_exchange.decode_answer("peer", garbage)


def test_a_run_directory_answer_round_trips() -> None:
    summary = {
        "run": "r",
        "model": "m",
        "policy_version": 3,
        "manifest_version": 1,
        "authority": "12D3KooW",
        "peers": {"trainer": 1},
        "time_ms": 5,
    }
    [got] = run_exchange.decode_answer(
        "peer", run_exchange.encode_answer([run_exchange.ServedRun(b"rel", summary)])
    )
    assert got.release == b"rel" and got.summary == summary


@pytest.mark.parametrize(
    "error, cause",
    [
        (
            "peer id does not correspond to the received pubkey: remote_peer=A, remote_peer_id_from_pubkey=B",
            join.WRONG_PEER,
        ),
        ("Error connecting to ('127.0.0.1', 1): Connection refused", join.REFUSED),
        ("no answer within 5 s", join.TIMED_OUT),
    ],
)
def test_dial_failures_are_named(error: str, cause: str) -> None:
    assert join.dial_cause(error, 5.0)[0] == cause


def test_sign_with_pin_model_pins_weights_and_files_of_that_directory(tmp_path: Path) -> None:
    a, _ = _keys(tmp_path)
    small = small_run_file(tmp_path / "small", "pinned", 8)
    model_dir = tmp_path / "small" / "model"
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(net_manifest("demo")))
    assert load_run_release(run)[0].model_files_digest == b""
    run_sign.main(run, a, model_dir=model_dir)
    manifest, data = load_run_release(run)
    assert manifest.model_digest == content_id(from_model_dir(model_dir))
    assert manifest.model_files_digest == content_id(encode_bundle(read_bundle_files(model_dir)))
    assert isinstance(rm.check(data, None, None), rm.Adopt)  # the pins are signed
    with pytest.raises(CommandError, match="--pin-model: model directory .* does not exist"):
        run_sign.main(run, a, model_dir=tmp_path / "nowhere")
    assert small.exists()
