"""The model stream protocol `/swarm-rl/<run>/model/1`: the run's model files and base
weights, by content id, in chunks.

    client -> server   [digest (32 bytes), chunk index]
    server -> client   [total bytes (0: not held here), chunk bytes (at most CHUNK_BYTES)]

Declared once as `SPEC` on `node.exchange.request_response`. `serve_model` answers it from
a map of content id → bytes or file; `fetch_blob` asks peers in turn for the bytes of one
content id and returns them only when they match it, charging a peer whose bytes do not.
What is fetched and where it goes is `node.model_fetch`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from node.errors import CommandError
from node.exchange.fields import Fields
from node.exchange.request_response import (
    BadRequestHook,
    ExchangeSpec,
    Inbound,
    MsgpackCodec,
    StreamHost,
    request,
    serve,
)
from node.host.host import PeerError
from protocol.content_id import content_id
from protocol.schema import Bytes, Int

PROTOCOL_ID = "/swarm-rl/{run}/model/1"
CHUNK_BYTES = 1 << 20
MAX_BLOB_BYTES = 64 << 30  # the largest weights file asked for (a 7B model in fp32 fits)
CHUNK_TIMEOUT_S = 30.0
PROGRESS_EVERY_S = 3.0
FETCH_ROUNDS = 30
ROUND_PAUSE_S = 2.0

SPEC: ExchangeSpec[tuple[bytes, int], tuple[int, bytes]] = ExchangeSpec(
    name="model files",
    protocol=PROTOCOL_ID,
    request=MsgpackCodec(
        "model files request",
        Fields((Bytes(32, sizes=(32,)), Int(0, MAX_BLOB_BYTES // CHUNK_BYTES))),
        64,
        limits={"max_array_len": 2, "max_bin_len": 32},
    ),
    response=MsgpackCodec(
        "model files chunk",
        Fields((Int(0, MAX_BLOB_BYTES), Bytes(CHUNK_BYTES))),
        CHUNK_BYTES + 64,
        limits={"max_array_len": 2, "max_bin_len": CHUNK_BYTES},
    ),
    requests_per_stream=1 << 16,
    max_streams_per_peer=2,
    deadline_s=600.0,
    bad_request="bad model files request",
)


def serve_model(
    host: StreamHost,
    run_id: str,
    blobs: Mapping[bytes, bytes | Path],
    on_bad_request: BadRequestHook | None = None,
) -> None:
    """Answer the model protocol on `host` with `blobs` (content id → the bytes, or the
    file holding them, read a chunk at a time off the event loop)."""

    async def answer(call: Inbound[tuple[int, bytes]], req: tuple[bytes, int]) -> None:
        digest, index = req
        blob = blobs.get(digest)
        if blob is None:
            await call.reply((0, b""))
        elif isinstance(blob, Path):
            await call.reply(await trio.to_thread.run_sync(_file_chunk, blob, index))
        else:
            start = index * CHUNK_BYTES
            await call.reply((len(blob), bytes(blob[start : start + CHUNK_BYTES])))

    serve(host, SPEC.for_run(run_id), answer, on_bad_request=on_bad_request)


async def fetch_blob(
    host: StreamHost,
    peers: Callable[[], list[str]],
    run_id: str,
    digest: bytes,
    what: str,
    say: Callable[[str], None],
    charge: Callable[[str, str], None],
    max_bytes: int = MAX_BLOB_BYTES,
    rounds: int = FETCH_ROUNDS,
) -> bytes:
    """The bytes whose content id is `digest`, from the first peer that holds them and
    sends them right, asking the connected peers (`peers()`) in turn, at most `rounds`
    times ROUND_PAUSE_S apart (a joiner may at first know only a bootstrap peer that does
    not hold the model); a peer that sends other bytes is charged and not asked again.
    `CommandError` naming what each peer answered when none served them."""
    spec = SPEC.for_run(run_id)
    problems: dict[str, str] = {}
    charged: set[str] = set()
    for round_ in range(rounds):
        if round_:
            await trio.sleep(ROUND_PAUSE_S)
        for peer in [p for p in peers() if p not in charged]:
            data, problem = await _from_peer(host, spec, peer, digest, what, say, max_bytes)
            if data is not None:
                return data
            if problem.startswith("charge: "):
                problem = problem.removeprefix("charge: ")
                charge(peer, f"{what}: {problem}")
                charged.add(peer)
            problems[peer] = problem
    detail = "; ".join(f"{p[:12]}: {why}" for p, why in problems.items()) or "no peer connected"
    raise CommandError(f"no peer served the run's {what}: {detail}")


async def _from_peer(
    host: StreamHost,
    spec: ExchangeSpec[tuple[bytes, int], tuple[int, bytes]],
    peer: str,
    digest: bytes,
    what: str,
    say: Callable[[str], None],
    max_bytes: int,
) -> tuple[bytes | None, str]:
    """(the bytes, "") from one peer, or (None, why not); a why that starts with
    "charge: " is the peer's fault."""
    parts: list[bytes] = []
    got = total = 0
    last = time.monotonic()
    try:
        while True:
            with trio.fail_after(CHUNK_TIMEOUT_S):
                size, chunk = await request(host, peer, spec, (digest, len(parts)))
            if size == 0:
                return None, "does not hold it"
            if size > max_bytes or (total and size != total) or not chunk:
                return None, "charge: inconsistent sizes"
            total = size
            parts.append(chunk)
            got += len(chunk)
            if got > total:
                return None, "charge: more bytes than announced"
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                say(f"fetching {what}: {got / 2**20:.1f} of {total / 2**20:.1f} MiB")
            if got == total:
                data = b"".join(parts)
                if content_id(data) == digest:
                    return data, ""
                return None, "charge: bytes that do not match the run's pin"
    except trio.TooSlowError:
        return None, f"no answer within {CHUNK_TIMEOUT_S:g} s"
    except PeerError as exc:
        return None, str(exc)


def _file_chunk(path: Path, index: int) -> tuple[int, bytes]:
    """(file size, chunk `index` of the file); (0, b"") when the file is gone."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(index * CHUNK_BYTES)
            return size, f.read(CHUNK_BYTES)
    except OSError:
        return 0, b""
