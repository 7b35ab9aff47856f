"""Mutation fuzzing of the decoders, shared by the codec benchmark and the tests.

Invariant (the h11 habit, written where the fuzzer lives): for any input bytes, opening a
record either returns the original record, or raises `RemoteProtocolError`. Anything else —
another exception, or a mutated record accepted — is a failure. The random source is seeded,
so a failing case can be replayed from its index.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from protocol.codec import decode, pack
from protocol.errors import RemoteProtocolError
from protocol.rollout import open_record
from protocol.wire import ALL_OBJECTS


@dataclass
class FuzzReport:
    """What a fuzz run tried and what broke the decoder invariant (a few examples kept)."""

    cases: int = 0
    failures: int = 0
    examples: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        """Count a failure and keep its description among the first few."""
        self.failures += 1
        if len(self.examples) < 5:
            self.examples.append(what)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.randrange(8)
    if op == 0:  # flip one bit
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # overwrite a few bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 2:  # truncate
        del b[rng.randrange(len(b)) :]
    elif op == 3:  # insert bytes
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 8))
    elif op == 4:  # delete a span
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 16)]
    elif op == 5:  # append garbage
        b += rng.randbytes(rng.randint(1, 32))
    elif op == 6:  # interesting msgpack type bytes
        b[rng.randrange(len(b))] = rng.choice(
            [
                0xC0,
                0xC1,
                0xC2,
                0xC3,
                0xC4,
                0xC5,
                0xC6,
                0xD9,
                0xDA,
                0xDB,
                0xDC,
                0xDD,
                0xDE,
                0xDF,
                0xCF,
                0xD3,
                0xCB,
                0xCA,
                0xC7,
                0xD4,
                0x90,
                0x9F,
                0x80,
                0xFF,
            ]
        )
    else:  # copy a span elsewhere
        i, j = rng.randrange(len(b)), rng.randrange(len(b))
        n = rng.randint(1, 32)
        b[j : j + n] = b[i : i + n]
    return bytes(b)


def _structured(rng: random.Random, record: bytes) -> bytes:
    """Re-encode the record with one decoded field changed: canonical bytes, wrong content."""
    outer = msgpack.unpackb(record, raw=False)
    part = rng.choice([1, 2])  # header envelope or body
    inner = msgpack.unpackb(outer[part], raw=False)
    i = rng.randrange(len(inner))
    v = inner[i]
    if isinstance(v, bool):
        inner[i] = not v
    elif isinstance(v, int):
        inner[i] = v + rng.choice([-1, 1, 2**32])
    elif isinstance(v, float):
        inner[i] = v + 1.0
    elif isinstance(v, bytes):
        inner[i] = v[:-1] + bytes([(v[-1] + 1) % 256]) if v else b"\x00"
    elif isinstance(v, str):
        inner[i] = v + "x"
    elif isinstance(v, list):
        inner[i] = v[:-1] if v else [0]
    outer[part] = pack(inner)
    return pack(outer)


def _mutate_part(rng: random.Random, record: bytes) -> bytes:
    """Mutate the header envelope, its payload, or the body, then re-wrap it canonically,
    so the inner decoders and the signature check see the damage, not just the outer one."""
    outer = msgpack.unpackb(record, raw=False)
    part = rng.choice([1, 2, 1])
    if part == 1 and rng.random() < 0.5:
        env = msgpack.unpackb(outer[1], raw=False)
        env[7] = _mutate(rng, env[7])  # the signed payload
        outer[1] = pack(env)
    else:
        outer[part] = _mutate(rng, outer[part])
    return pack(outer)


def fuzz_record(
    record: bytes,
    cases: int,
    seed: int = 0,
    opener: Callable[[bytes], object] = open_record,
) -> FuzzReport:
    """Run `cases` inputs (random bytes, byte mutations, structured mutations) at `opener`."""
    rng = random.Random(seed)
    report = FuzzReport()
    for case in range(cases):
        kind = case % 10
        if kind == 0:
            data = rng.randbytes(rng.choice([0, 1, 2, 7, 64, 512, 4096]))
        elif kind == 1:
            data = _structured(rng, record)
        elif kind in (2, 3, 4):
            data = _mutate_part(rng, record)
        else:
            data = record
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                data = _mutate(rng, data) if data else rng.randbytes(4)
        report.cases += 1
        try:
            opener(data)
        except RemoteProtocolError:
            continue
        except Exception as exc:  # the invariant: nothing but RemoteProtocolError escapes
            report.fail(f"case {case}: {type(exc).__name__}: {exc}")
            continue
        if data != record:
            report.fail(f"case {case}: mutated record accepted")
    return report


def fuzz_decoders(cases: int, seed: int = 0) -> FuzzReport:
    """Random and msgpack-shaped bytes at every wire object's decoder."""
    rng = random.Random(seed)
    report = FuzzReport()
    shapes = [
        lambda: rng.randbytes(rng.randint(0, 64)),
        lambda: msgpack.packb(
            [1]
            + [
                rng.choice([0, -1, 1.5, "x", b"y", [], {}, None, True, 2**64 - 1])
                for _ in range(rng.randint(0, 16))
            ]
        ),
        lambda: msgpack.packb([rng.randint(0, 3), {"a": 1}, [[1, 2]], b"\x00" * rng.randint(0, 9)]),
    ]
    for case in range(cases):
        cls = ALL_OBJECTS[case % len(ALL_OBJECTS)]
        data = rng.choice(shapes)()
        report.cases += 1
        try:
            decode(cls, data)
        except RemoteProtocolError:
            continue
        except Exception as exc:
            report.fail(f"case {case} ({cls.__name__}): {type(exc).__name__}: {exc}")
    return report
