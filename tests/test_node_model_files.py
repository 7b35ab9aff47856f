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
