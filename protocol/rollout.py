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

import msgpack

from protocol.codec import decode, encode
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
        fileobj.write(msgpack.packb(rec, use_bin_type=True))
        n += 1
    return n


def read_records(fileobj: BinaryIO) -> Iterator[bytes]:
    """Yield each record's bytes from a msgpack stream (not yet opened or checked).

    Raises `DecodeError` when the stream holds anything but bounded `bin` items.
    """
    unpacker = msgpack.Unpacker(
        fileobj,
        raw=False,
        max_buffer_size=RolloutRecord.MAX_BYTES + 16,
        max_bin_len=RolloutRecord.MAX_BYTES,
        max_str_len=0,
        max_array_len=0,
        max_map_len=0,
        max_ext_len=0,
    )
    start = fileobj.tell() if fileobj.seekable() else None
    index = 0
    while True:
        try:
            item = next(unpacker)
        except StopIteration:
            if start is not None and fileobj.seek(0, 2) != start + unpacker.tell():
                raise DecodeError("RolloutStream", f"item {index}", "truncated") from None
            return
        except Exception as exc:
            raise DecodeError("RolloutStream", f"item {index}", f"unreadable ({exc})") from None
        if type(item) is not bytes:
            raise DecodeError("RolloutStream", f"item {index}", "not a bin record")
        yield item
        index += 1
