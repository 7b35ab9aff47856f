"""`swarm-node bench codec`: encode/decode/sign/verify rates of a typical rollout record,
and the decoder fuzz count.

The typical record: 96 prompt + 416 completion tokens (512 in all), per-token float32
log-probs, 16 activation proofs of 258 bytes (TOPLOC's k = 128), signed header.
"""

from __future__ import annotations

import array
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from protocol.codec import decode, encode
from protocol.envelope import signing_bytes
from protocol.fuzz import fuzz_decoders, fuzz_record
from protocol.identity import Identity, verify_signature
from protocol.rollout import make_header, make_record
from protocol.wire import Envelope, RolloutBody, RolloutHeader, RolloutRecord


def typical_body(rng: random.Random) -> RolloutBody:
    """A rollout body of typical size: 96 prompt and 416 completion tokens with log-probs."""

    def f32(x: float) -> float:
        return array.array("f", [x])[0]

    return RolloutBody(
        prompt_ids=tuple(rng.randrange(32_000) for _ in range(96)),
        completion_ids=tuple(rng.randrange(32_000) for _ in range(416)),
        logprobs=tuple(f32(-rng.random() * 5) for _ in range(416)),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=512,
        sampling_seed=rng.getrandbits(64),
        finish_reason="eos",
        proofs=tuple(rng.randbytes(258) for _ in range(16)),
    )


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of `fn`, timed over about `seconds`."""
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(20):
            fn()
        n += 20
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def run(quick: bool, args: list[str]) -> dict:
    """Time encode, decode, sign and verify of a typical record, then run the decoder fuzz."""
    if args:
        raise SystemExit(f"bench codec takes no extra arguments, got {args}")
    rng = random.Random(1)
    identity = Identity.generate()
    body = typical_body(rng)
    fields: dict[str, Any] = dict(
        dataset="basic_arithmetic", task_index=7, counter=3, task_seed=11, reward=1.0
    )
    stamp: dict[str, Any] = dict(
        run_id="bench", policy_version=3, seq=1, timestamp_ms=1_700_000_000_000
    )
    record = make_record(identity, body, **fields, **stamp)
    rec = decode(RolloutRecord, record)
    env = decode(Envelope, rec.header)
    header = decode(RolloutHeader, env.payload)
    message = signing_bytes(env)
    seconds = 0.4 if quick else 2.0

    def encode_all() -> bytes:
        body_bytes = encode(body)
        h = make_header(body, body_bytes, **fields)
        e = Envelope(**{**{n: getattr(env, n) for n, _ in env.wire_fields()}, "payload": encode(h)})
        return encode(RolloutRecord(header=encode(e), body=body_bytes))

    def decode_all() -> None:
        r = decode(RolloutRecord, record)
        decode(RolloutHeader, decode(Envelope, r.header).payload)
        decode(RolloutBody, r.body)

    assert encode_all() == record and header.body_size == len(rec.body)
    print("timing encode/decode/sign/verify ...", file=sys.stderr)
    result = {
        "encode_per_s": round(_rate(encode_all, seconds), 1),
        "decode_per_s": round(_rate(decode_all, seconds), 1),
        "sign_per_s": round(_rate(lambda: identity.sign(message), seconds), 1),
        "verify_per_s": round(
            _rate(lambda: verify_signature(env.signer, message, env.signature), seconds), 1
        ),
        "record_bytes": len(record),
    }
    cases = 4_000 if quick else 20_000
    print(f"fuzzing {cases} mutated records + {cases // 4} raw decoder inputs ...", file=sys.stderr)
    t = time.perf_counter()
    rec_report = fuzz_record(record, cases, seed=2)
    dec_report = fuzz_decoders(cases // 4, seed=3)
    for example in rec_report.examples + dec_report.examples:
        print("  fuzz failure:", example, file=sys.stderr)
    result.update(
        fuzz_cases=rec_report.cases + dec_report.cases,
        fuzz_failures=rec_report.failures + dec_report.failures,
        fuzz_seconds=round(time.perf_counter() - t, 2),
        record_tokens=len(body.prompt_ids) + len(body.completion_ids),
        record_proofs=len(body.proofs),
    )
    return result
