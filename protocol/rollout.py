"""Rollout records: a signed header (gossiped) plus its body (pulled), and files of them.

A record is `RolloutRecord(header=<Envelope bytes of a RolloutHeader>, body=<RolloutBody
bytes>)`. The header's `body_digest` binds the body, so one signature covers both. The
rollout's id is the content id of the header envelope bytes.

Files of records (`swarm-node rollouts --out`) are msgpack streams: one msgpack `bin` per
record, each holding a record's canonical bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from protocol.codec import decode, encode, pack
from protocol.content_id import content_id
from protocol.envelope import open_envelope, seal
from protocol.errors import DecodeError, IntegrityError
from protocol.identity import Identity
from protocol.wire import Envelope, RolloutBody, RolloutHeader, RolloutRecord


@dataclass(frozen=True, slots=True)
class OpenedRollout:
    """A record whose signature, body digest and shape all checked out."""

    envelope: Envelope
    header: RolloutHeader
    body: RolloutBody
    rollout_id: bytes
    record: bytes


def make_header(
    body: RolloutBody,
    body_bytes: bytes,
    *,
    dataset: str,
    task_index: int,
    counter: int,
    task_seed: int,
    reward: float,
) -> RolloutHeader:
    """The `RolloutHeader` of a body: the task's identifiers, the reward, the token counts,
    and the body's digest and size."""
    return RolloutHeader(
        dataset=dataset,
        task_index=task_index,
        counter=counter,
        task_seed=task_seed,
        reward=float(reward),
        n_prompt=len(body.prompt_ids),
        n_completion=len(body.completion_ids),
        body_digest=content_id(body_bytes),
        body_size=len(body_bytes),
    )


def make_record(
    identity: Identity,
    body: RolloutBody,
    *,
    dataset: str,
    task_index: int,
    counter: int,
    task_seed: int,
    reward: float,
    run_id: str,
    policy_version: int,
    seq: int,
    timestamp_ms: int,
) -> bytes:
    """Sign a rollout and return its record bytes."""
    body_bytes = encode(body)
    header = make_header(
        body,
        body_bytes,
        dataset=dataset,
        task_index=task_index,
        counter=counter,
        task_seed=task_seed,
        reward=reward,
    )
    header_env = seal(
        identity,
        header,
        run_id=run_id,
        policy_version=policy_version,
        seq=seq,
        timestamp_ms=timestamp_ms,
    )
    return encode(RolloutRecord(header=header_env, body=body_bytes))


def open_header(header_env: bytes) -> tuple[Envelope, RolloutHeader, bytes]:
    """Check a gossiped header alone: returns (envelope, header, rollout id)."""
    env, header = open_envelope(header_env, RolloutHeader)
    return env, header, content_id(header_env)


def check_body(header: RolloutHeader, body_bytes: bytes) -> RolloutBody:
    """Decode a pulled body and check it is the one the signed header promised."""
    if len(body_bytes) != header.body_size or content_id(body_bytes) != header.body_digest:
        raise IntegrityError("rollout body does not match the signed header's digest")
    body = decode(RolloutBody, body_bytes)
    if len(body.prompt_ids) != header.n_prompt or len(body.completion_ids) != header.n_completion:
        raise DecodeError("RolloutBody", None, "token counts differ from the header's")
    if len(body.logprobs) != len(body.completion_ids):
        raise DecodeError("RolloutBody", "logprobs", "one log-prob per completion token needed")
    return body


def open_record(data: bytes) -> OpenedRollout:
    """Decode and check a whole record. Raises `RemoteProtocolError` subclasses only."""
    record = decode(RolloutRecord, data)
    env, header, rollout_id = open_header(record.header)
    body = check_body(header, record.body)
    return OpenedRollout(env, header, body, rollout_id, bytes(data))


def write_records(fileobj: BinaryIO, records: Iterable[bytes]) -> int:
    """Append records to a msgpack stream; returns how many were written."""
    n = 0
    for rec in records:
        fileobj.write(pack(rec))
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One item of a record stream: its `record` bytes, or (record None) a `problem` with
    a one-line `detail`. Problems: `stream-empty` (no bytes at all), `stream-truncated`
    (the stream ends inside an item), `stream-garbage` (bytes that are not a msgpack
    `bin`; reading stops there, nothing after it can be framed), `record-too-large` (a
    `bin` longer than a record may be; skipped, reading goes on after it)."""

    index: int
    offset: int
    record: bytes | None = None
    problem: str = ""
    detail: str = ""


# msgpack bin headers: type byte -> width of the big-endian length that follows
_BIN_LEN_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_SKIP_CHUNK = 1 << 20


def _read_exactly(fileobj: BinaryIO, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = fileobj.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _skip(fileobj: BinaryIO, n: int) -> int:
    """Skip n bytes (reading in bounded chunks); returns how many were there."""
    done = 0
    while done < n:
        part = fileobj.read(min(_SKIP_CHUNK, n - done))
        if not part:
            break
        done += len(part)
    return done


def scan_records(
    fileobj: BinaryIO, max_bytes: int = RolloutRecord.MAX_BYTES
) -> Iterator[StreamItem]:
    """Every item of a msgpack record stream, in order, each a record or a problem (see
    `StreamItem`); never raises on bad bytes and never holds more than one record (at most
    `max_bytes`) in memory. An empty stream yields one `stream-empty` item."""
    index = offset = 0
    while True:
        head = fileobj.read(1)
        if not head:
            if index == 0:
                yield StreamItem(
                    0, 0, problem="stream-empty", detail="no records: the file is empty"
                )
            return
        width = _BIN_LEN_BYTES.get(head[0])
        if width is None:
            yield StreamItem(
                index,
                offset,
                problem="stream-garbage",
                detail=f"byte 0x{head[0]:02x} at offset {offset} does not start a record",
            )
            return
        raw = _read_exactly(fileobj, width)
        if len(raw) < width:
            yield StreamItem(
                index,
                offset,
                problem="stream-truncated",
                detail=f"stream ends inside the header of item {index} at offset {offset}",
            )
            return
        size = int.from_bytes(raw, "big")
        if size > max_bytes:
            got = _skip(fileobj, size)
            if got < size:
                yield StreamItem(
                    index,
                    offset,
                    problem="stream-truncated",
                    detail=f"item {index} promises {size} bytes, the stream ends after {got}",
                )
                return
            yield StreamItem(
                index,
                offset,
                problem="record-too-large",
                detail=f"item {index} is {size} bytes, a record is at most {max_bytes}",
            )
        else:
            data = _read_exactly(fileobj, size)
            if len(data) < size:
                yield StreamItem(
                    index,
                    offset,
                    problem="stream-truncated",
                    detail=f"item {index} promises {size} bytes, the stream ends after {len(data)}",
                )
                return
            yield StreamItem(index, offset, record=data)
        index += 1
        offset += 1 + width + size


def read_records(fileobj: BinaryIO) -> Iterator[bytes]:
    """Yield each record's bytes from a msgpack stream (not yet opened or checked).

    Raises `DecodeError` at the first problem `scan_records` finds (an empty stream is
    no problem here: it holds zero records).
    """
    for item in scan_records(fileobj):
        if item.record is not None:
            yield item.record
        elif item.problem != "stream-empty":
            raise DecodeError(
                "RolloutStream", f"item {item.index}", f"{item.problem}: {item.detail}"
            )
