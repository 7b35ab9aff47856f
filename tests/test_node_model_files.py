"""The model protocol (`node.exchange.model_files`) between two real hosts: bytes served by
content id in chunks, a peer whose bytes do not match the pin charged and not asked again,
and a directory fetched into place (`node.model_fetch`)."""

from __future__ import annotations

import secrets
from pathlib import Path

import trio

from node.exchange import model_files
from node.exchange.model_files import fetch_blob, serve_model
from node.host.host import open_host
from protocol.content_id import content_id

RUN = "model-files-test"


def test_a_blob_comes_in_chunks_from_a_file_and_wrong_bytes_are_charged(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(model_files, "CHUNK_BYTES", 1000)
    blob = secrets.token_bytes(4500)  # five chunks
    path = tmp_path / "weights.bin"
    path.write_bytes(blob)
    digest = content_id(blob)
    charged: list[tuple[str, str]] = []
    lines: list[str] = []

    async def main() -> None:
        with trio.fail_after(60):
            async with (
                open_host(secrets.token_bytes(32)) as liar,
                open_host(secrets.token_bytes(32)) as honest,
                open_host(secrets.token_bytes(32)) as client,
            ):
                serve_model(liar, RUN, {digest: secrets.token_bytes(4500)})
                serve_model(honest, RUN, {digest: path})
                for server in (liar, honest):
                    assert (await client.connect(server.listen_addrs()[0])).ok
                order = [liar.peer_id, honest.peer_id]
                got = await fetch_blob(
                    client,
                    lambda: order,
                    RUN,
                    digest,
                    "base weights",
                    lines.append,
                    lambda p, why: charged.append((p, why)),
                )
                assert got == blob
                assert charged == [
                    (liar.peer_id, "base weights: bytes that do not match the run's pin")
                ]

    trio.run(main)


def test_no_peer_holding_it_is_one_line_naming_what_each_said(monkeypatch) -> None:
    monkeypatch.setattr(model_files, "ROUND_PAUSE_S", 0.01)
    digest = content_id(b"absent")

    async def main() -> None:
        with trio.fail_after(60):
            async with (
                open_host(secrets.token_bytes(32)) as server,
                open_host(secrets.token_bytes(32)) as client,
            ):
                serve_model(server, RUN, {})
                assert (await client.connect(server.listen_addrs()[0])).ok
                try:
                    await fetch_blob(
                        client,
                        lambda: [server.peer_id],
                        RUN,
                        digest,
                        "model files",
                        lambda _m: None,
                        lambda _p, _w: None,
                        rounds=2,
                    )
                except Exception as exc:  # noqa: BLE001 - the type and text are the test
                    assert type(exc).__name__ == "CommandError"
                    assert str(exc) == (
                        f"no peer served the run's model files: {server.peer_id[:12]}: "
                        "does not hold it"
                    )
                else:
                    raise AssertionError("fetch_blob returned without a peer holding it")

    trio.run(main)


def test_a_fetched_version_is_written_from_the_stores_file_with_its_tensors(
    tmp_path: Path,
) -> None:
    import torch
    from safetensors.torch import load_file

    from node.model_fetch import FETCHED_FILE, _write_dir, fetched_version
    from trainer.checkpoint import from_state_dict

    state = {"a.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    stored = tmp_path / "v3.safetensors"
    stored.write_bytes(from_state_dict(state))
    dest = tmp_path / "models" / "run-x"
    _write_dir(dest, {"config.json": b"{}"}, stored, 3)
    back = load_file(str(dest / "model.safetensors"))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    assert (dest / "config.json").read_bytes() == b"{}" and (dest / FETCHED_FILE).is_file()
    assert fetched_version(dest) == 3
