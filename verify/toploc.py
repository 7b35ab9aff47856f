"""Activation-hash proofs, byte-compatible with TOPLOC (`toploc` 0.1.6, decode chunks).

What this module owns: turning the last hidden states of generated tokens into proof bytes,
and checking proof bytes against recomputed hidden states. It knows nothing of models,
rollouts or thresholds (those live in `verify.checks`); it never touches the network.

The scheme, step by step (one proof per chunk of `chunk` = 32 generated tokens):

1. Take the chunk's hidden states `[t, H]` (t = 32, or fewer for the last chunk), as bf16,
   and flatten them row-major: position `i*H + j` is token i, feature j.
2. Select the k = `topk` = 128 positions of largest |value| with `torch.topk` on the
   absolute values, exactly as the reference does. Exact ties at the k-th place are broken
   by torch's CPU top-k kernel (not "lowest index first"); the same kernel is used here so
   the bytes equal the reference's. A verifier that breaks a tie the
   other way sees one or two unexpected indices, which costs that many exponent mismatches
   and stays far inside the thresholds.
3. Each selected value becomes its bf16 bit pattern (0..65535) read as an integer mod
   p = 65497 (a prime).
4. The injective modulus m: the largest m in 65497, 65496, ..., 1 such that the selected
   positions are pairwise distinct mod m.
5. Interpolate the unique polynomial P of degree < k over GF(p) with P(pos mod m) = value
   (Newton divided differences, O(k^2)), expanded to coefficients c_0..c_{k-1} ascending.
   The polynomial is unique, so any correct interpolation gives the same coefficients.
6. Bytes: m as uint16 big-endian, then c_0..c_{k-1} as uint16 big-endian: 2 + 2k bytes
   (258 for k = 128).

Verification recomputes step 2 on the verifier's own hidden states, evaluates P at each
selected position mod m, reads the result as a bf16 bit pattern and compares it with the
recomputed value: the count of exponent mismatches, and over the positions whose exponents
match, the mean and median absolute difference of the 7-bit mantissas. The median is the
upper median (`sorted[n // 2]`), as in the reference's C++ verifier; with no matching
exponent both statistics are 2**64. Beyond the reference we also count sign mismatches
among the positions whose magnitudes agree (same exponent, mantissa within 2 units): TOPLOC
ignores the sign; a position the verifier selects but the prover did not evaluates to
noise, which must not count as a flipped sign.

Deliberate differences from the reference, where the reference has no defined behaviour:
- A chunk with fewer than k values (a short last chunk with a small H) interpolates through
  all of its values and pads the coefficients with zeros up to k (the same polynomial), so
  the proof is still 2 + 2k bytes. The reference raises inside `torch.topk` there and
  silently emits all-zero "null" proofs for the whole rollout.
- Non-finite activations raise `ValueError` instead of being hashed: an honest model never
  produces them after the final norm, and the reference's fallback (null proofs) is a
  silent failure we refuse to copy.
- Parsing is strict: a proof must be exactly 2 + 2k bytes, 1 <= m <= 65497, every
  coefficient < p, and m large enough to be injective on the chunk's point count. The
  reference's null proof (m = 0, all zeros) is malformed here, never a pass.

Everything is vectorised across chunks with numpy uint32 arithmetic (operands below p keep a
product plus one more operand below 2^32); the only per-chunk
Python loop is the (rarely more than one step) modulus search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

R = TypeVar("R")

P = 65497  # the prime field of the reference
CHUNK = 32  # generated tokens per proof
TOPK = 128  # values per proof
NO_MATCH = float(2**64)  # mantissa statistics when no exponent matches (as the reference)

BF16_EXP_MASK = 0x7F80
BF16_MANT_MASK = 0x007F
BF16_SIGN_MASK = 0x8000
# A sign mismatch counts only where the magnitude agrees (same exponent, mantissa within
# this many units): a position the prover did not select evaluates to a random value,
# whose exponent matches by chance about once in 256 and whose sign is a coin toss.
SIGN_MANT_TOL = 2


class ProofFormatError(ValueError):
    """Proof bytes that cannot be a proof: wrong length, bad modulus or coefficient, or a
    proof count that does not match the number of chunks."""


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """Verification of one chunk. The first three fields are the reference's
    `VerificationResult`; all are error measures (bigger is worse)."""

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    sign_mismatches: int
    points: int

    def as_tuple(self) -> tuple[int, float, float]:
        """The reference's (exp mismatches, mantissa mean, mantissa median)."""
        return (self.exp_mismatches, self.mant_err_mean, self.mant_err_median)


def proof_size(topk: int = TOPK) -> int:
    """Bytes of one proof: uint16 modulus + `topk` uint16 coefficients."""
    return 2 + 2 * topk


def n_chunks(n_tokens: int, chunk: int = CHUNK) -> int:
    """Proof chunks of `chunk` tokens that `n_tokens` generated tokens make (the last may be
    short)."""
    return (n_tokens + chunk - 1) // chunk


# ---------------------------------------------------------------- field arithmetic

_INV_TABLE: np.ndarray | None = None


def _inverses() -> np.ndarray:
    """inv[a] = (a mod p)^(p-2) mod p for a in 0..2p-1 (0 for a multiple of p, never
    used), uint32."""
    global _INV_TABLE
    if _INV_TABLE is None:
        base = np.arange(P, dtype=np.int64)
        result = np.ones(P, dtype=np.int64)
        e = P - 2
        while e:
            if e & 1:
                result = result * base % P
            base = base * base % P
            e >>= 1
        result[0] = 0
        _INV_TABLE = np.tile(result.astype(np.uint32), 2)
    return _INV_TABLE


def injective_moduli(positions: np.ndarray) -> np.ndarray:
    """For each row of `positions` [C, n] (distinct non-negative ints), the largest
    m <= 65497 with all `positions % m` distinct in that row. Returns int64 [C]."""
    positions = np.asarray(positions, dtype=np.int64)
    c, n = positions.shape
    out = np.zeros(c, dtype=np.int64)
    todo = np.arange(c)
    m = P
    while todo.size and m > 0:
        if m < n:  # pigeonhole: no smaller modulus can be injective
            break
        r = np.sort(positions[todo] % m, axis=1)
        ok = ~np.any(r[:, 1:] == r[:, :-1], axis=1) if n > 1 else np.ones(todo.size, bool)
        out[todo[ok]] = m
        todo = todo[~ok]
        m -= 1
    if todo.size:
        raise ValueError("no injective modulus found")  # only for duplicate positions
    return out


def interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Coefficients (ascending, [C, n]) of the polynomials of degree < n over GF(p) through
    (xs[c, i], ys[c, i]); xs distinct mod p within a row. Newton divided differences, then
    the Newton form expanded Horner-style from its innermost term:
    P = d_0 + (x - x_0)(d_1 + (x - x_1)(d_2 + ...)).

    The arithmetic is uint32: every operand is below p < 2^16, so a product plus one more
    operand stays below 2^32 ((p-1)^2 + (p-1) < 2^32), and 32-bit remainders cost half as
    much as 64-bit ones; this function dominates the cost of proof building."""
    p = np.uint32(P)
    xs = (np.asarray(xs, dtype=np.int64) % P).astype(np.uint32)
    dd = (np.asarray(ys, dtype=np.int64) % P).astype(np.uint32)  # [C, n]
    c, n = dd.shape
    inv = _inverses()  # 2p entries: a difference plus p needs no reduction before lookup
    for k in range(1, n):
        num = dd[:, k:] + (p - dd[:, k - 1 : n - 1])  # < 2p
        np.minimum(num, num - p, out=num)  # -> < p (below p, num - p wraps around)
        num *= np.take(inv, xs[:, k:] + (p - xs[:, : n - k]))
        num %= p
        dd[:, k:] = num
    neg_x = (p - xs) % p
    coeffs = np.zeros((c, n), dtype=np.uint32)
    coeffs[:, 0] = dd[:, n - 1]
    for i in range(n - 2, -1, -1):
        length = n - 1 - i  # coefficients of the polynomial so far
        step = coeffs[:, :length] * neg_x[:, i : i + 1]
        step[:, 1:] += coeffs[:, : length - 1]
        step[:, 0] += dd[:, i]
        step %= p
        coeffs[:, length] = coeffs[:, length - 1]
        coeffs[:, :length] = step
    return coeffs.astype(np.int64)


def evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Horner evaluation over GF(p): coeffs [C, k] ascending, xs [C, n] -> [C, n] (int64;
    the arithmetic is uint32, as in `interpolate`)."""
    p = np.uint32(P)
    coeffs = (np.asarray(coeffs, dtype=np.int64) % P).astype(np.uint32)
    xs = (np.asarray(xs, dtype=np.int64) % P).astype(np.uint32)
    result = np.broadcast_to(coeffs[:, -1:], xs.shape).copy()
    for j in range(coeffs.shape[1] - 2, -1, -1):
        result *= xs
        result += coeffs[:, j : j + 1]
        result %= p
    return result.astype(np.int64)


# ---------------------------------------------------------------- top-k selection


def _as_bf16(activations: torch.Tensor) -> torch.Tensor:
    if not isinstance(activations, torch.Tensor) or activations.dim() != 2:
        raise ValueError("activations must be a [T, H] tensor")
    x = activations.detach()
    if x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    x = x.cpu().contiguous()
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("activations contain NaN or inf")
    return x


# ---------------------------------------------------------------- build


def _grouped_chunks(
    xs: list[torch.Tensor], chunk: int
) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(rows, H) -> [(rollout, chunk index)]: chunks of equal shape, batched together."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, x in enumerate(xs):
        t, h = x.shape
        for c in range(n_chunks(t, chunk)):
            rows = min(chunk, t - c * chunk)
            groups.setdefault((rows, h), []).append((i, c))
    return groups


def _select(
    xs: list[torch.Tensor], items: list[tuple[int, int]], rows: int, h: int, chunk: int, topk: int
):
    """Top-k positions and bf16 bit patterns of a batch of equally shaped chunks."""
    flat = torch.stack([xs[i][c * chunk : c * chunk + rows] for i, c in items]).reshape(
        len(items), rows * h
    )
    n = min(topk, rows * h)
    idx_t = flat.abs().topk(n, dim=-1).indices  # torch's CPU kernel, as the reference
    vals = torch.gather(flat, 1, idx_t)
    pos = idx_t.numpy().astype(np.int64)
    bits = vals.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    return pos, bits, n


def build_proofs_bytes(
    activations: torch.Tensor, chunk: int = CHUNK, topk: int = TOPK
) -> list[bytes]:
    """One proof per chunk of `chunk` rows of `activations` [T, H] (the generated tokens'
    last hidden states, bf16; other float dtypes are rounded to bf16 first)."""
    return build_proofs_bytes_many([activations], chunk, topk)[0]


def build_proofs_bytes_many(
    activations: list[torch.Tensor], chunk: int = CHUNK, topk: int = TOPK
) -> list[list[bytes]]:
    """`build_proofs_bytes` for many rollouts at once: chunks of the same shape from all of
    them share one top-k call and one vectorised interpolation (much faster for many short
    rollouts than one call each)."""
    if chunk < 1 or not 1 <= topk <= 0x7FFF:
        raise ValueError("chunk must be >= 1 and topk in 1..32767")
    xs = [_as_bf16(a) for a in activations]
    if any(x.shape[1] == 0 for x in xs):
        raise ValueError("activations have no features")
    out: list[list[bytes]] = [[b""] * n_chunks(x.shape[0], chunk) for x in xs]
    # Top-k per group of equally shaped chunks; then one modulus search and one
    # interpolation per point count n for all chunks (usually every chunk has n = topk
    # points whatever its length): the O(n^2) interpolation loop runs once per batch, not
    # once per distinct chunk length (it dominates the cost of proof building).
    by_n: dict[int, list[tuple[list[tuple[int, int]], np.ndarray, np.ndarray]]] = {}
    for (rows, h), items in _grouped_chunks(xs, chunk).items():
        pos, bits, n = _select(xs, items, rows, h, chunk, topk)
        by_n.setdefault(n, []).append((items, pos, bits))
    for n, parts in by_n.items():
        items = [it for part in parts for it in part[0]]
        pos = np.concatenate([part[1] for part in parts])
        bits = np.concatenate([part[2] for part in parts])
        moduli = injective_moduli(pos)
        coeffs = interpolate(pos % moduli[:, None], bits)
        if n < topk:
            coeffs = np.concatenate([coeffs, np.zeros((len(items), topk - n), np.int64)], axis=1)
        words = np.empty((len(items), topk + 1), dtype=">u2")
        words[:, 0] = moduli
        words[:, 1:] = coeffs
        for (i, c), row in zip(items, words, strict=True):
            out[i][c] = row.tobytes()
    return out


# ---------------------------------------------------------------- verify


def parse_proof(data: bytes, topk: int = TOPK, points: int | None = None) -> tuple[int, np.ndarray]:
    """(m, coefficients int64 [topk]) of one proof, or `ProofFormatError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProofFormatError(f"proof is {type(data).__name__}, not bytes")
    data = bytes(data)
    if len(data) != proof_size(topk):
        raise ProofFormatError(f"proof is {len(data)} bytes, expected {proof_size(topk)}")
    words = np.frombuffer(data, dtype=">u2").astype(np.int64)
    m = int(words[0])
    coeffs = words[1:]
    if not 1 <= m <= P:
        raise ProofFormatError(f"modulus {m} outside 1..{P}")
    if points is not None and m < points:
        raise ProofFormatError(f"modulus {m} cannot be injective on {points} points")
    if int(coeffs.max(initial=0)) >= P:
        raise ProofFormatError(f"coefficient >= {P}")
    return m, coeffs


def is_null_proof(data: bytes) -> bool:
    """True for an all-zero proof (the reference's silent failure output)."""
    return len(data) > 0 and not any(bytes(data))


def verify_proofs_bytes(
    activations: torch.Tensor,
    proofs: list[bytes],
    chunk: int = CHUNK,
    topk: int = TOPK,
) -> list[ChunkResult]:
    """Check `proofs` against recomputed hidden states `activations` [T, H]; one
    `ChunkResult` per chunk. Raises `ProofFormatError` for malformed proofs or a wrong
    number of proofs, `ValueError` for unusable activations."""
    return verify_proofs_bytes_many([activations], [proofs], chunk, topk)[0]


def verify_proofs_bytes_many(
    activations: list[torch.Tensor],
    proofs: list[list[bytes]],
    chunk: int = CHUNK,
    topk: int = TOPK,
) -> list[list[ChunkResult]]:
    """`verify_proofs_bytes` for many rollouts at once (chunks of equal shape batched).
    Raises on the first malformed proof or unusable activations of any rollout."""
    return compare_many(activations, proofs, _compare, chunk, topk)


def compare_many(
    activations: Sequence[torch.Tensor],
    proofs: Sequence[Sequence[bytes]],
    stats: Callable[[np.ndarray, np.ndarray], list[R]],
    chunk: int = CHUNK,
    topk: int = TOPK,
) -> list[list[R]]:
    """Evaluate every proof at its chunk's recomputed top-k positions and summarise.

    Chunks of equal shape are batched across rollouts. `stats(claimed, got)` receives the
    bf16 bit patterns [chunks, points] the proofs claim and the ones recomputed from
    `activations`, and returns one summary per row; the result is, per rollout, one
    summary per chunk. Raises `ProofFormatError` for malformed proofs or a wrong number of
    proofs, `ValueError` for unusable activations.
    """
    if len(activations) != len(proofs):
        raise ValueError(f"{len(activations)} activations for {len(proofs)} proof lists")
    xs = _as_bf16_many(activations)
    for x, pl in zip(xs, proofs, strict=True):
        if len(pl) != n_chunks(x.shape[0], chunk):
            raise ProofFormatError(
                f"{len(pl)} proofs for {n_chunks(x.shape[0], chunk)} chunks of {x.shape[0]} tokens"
            )
    out: list[list[R | None]] = [[None] * len(pl) for pl in proofs]
    # Top-k per group of equally shaped chunks, then one evaluation and one summary per
    # point count for all chunks (usually every chunk has n = topk points whatever its
    # length): the O(n * k) Horner loop runs once, not once per distinct chunk length.
    by_n: dict[int, list[tuple[list[tuple[int, int]], np.ndarray, np.ndarray]]] = {}
    for (rows, h), items in _grouped_chunks(xs, chunk).items():
        pos, got, n = _select(xs, items, rows, h, chunk, topk)
        by_n.setdefault(n, []).append((items, pos, got))
    for n, parts in by_n.items():
        items = [it for part in parts for it in part[0]]
        moduli, coeffs = parse_proofs([proofs[i][c] for i, c in items], topk, n)
        pos = np.concatenate([part[1] for part in parts])
        got = np.concatenate([part[2] for part in parts])
        claimed = evaluate(coeffs, pos % moduli[:, None])
        for (i, c), res in zip(items, stats(claimed, got), strict=True):
            out[i][c] = res
    return [[r for r in rs if r is not None] for rs in out]


def parse_proofs(
    data: Sequence[bytes], topk: int = TOPK, points: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`parse_proof` of many proofs: (moduli int64 [N], coefficients int64 [N, topk]).
    Raises the `ProofFormatError` of the first malformed proof."""
    size = proof_size(topk)
    if all(isinstance(d, bytes) and len(d) == size for d in data):
        words = (
            np.frombuffer(b"".join(data), dtype=">u2").reshape(len(data), topk + 1).astype(np.int64)
        )
        moduli, coeffs = words[:, 0], words[:, 1:]
        low = 1 if points is None else max(1, points)
        if bool(((moduli >= low) & (moduli <= P)).all()) and int(coeffs.max(initial=0)) < P:
            return moduli, coeffs
    parsed = [parse_proof(d, topk, points) for d in data]  # raises for the first bad one
    return np.array([m for m, _ in parsed], dtype=np.int64), np.stack([c for _, c in parsed])


def _as_bf16_many(activations: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`_as_bf16` of each; one conversion and one finiteness check for all when they are
    [T, H] tensors of one width and dtype."""
    ok = all(isinstance(a, torch.Tensor) and a.dim() == 2 for a in activations)
    if not ok or len({(a.shape[1], a.dtype, a.device) for a in activations}) != 1:
        return [_as_bf16(a) for a in activations]
    flat = _as_bf16(torch.cat([a.detach() for a in activations]))
    out, start = [], 0
    for a in activations:
        out.append(flat[start : start + a.shape[0]])
        start += a.shape[0]
    return out


def _compare(claimed: np.ndarray, got: np.ndarray) -> list[ChunkResult]:
    """Exponent, mantissa and sign comparison of bf16 bit patterns, row by row."""
    exp_c = (claimed & BF16_EXP_MASK) >> 7
    exp_g = (got & BF16_EXP_MASK) >> 7
    match = exp_c == exp_g
    mant_err = np.abs((claimed & BF16_MANT_MASK) - (got & BF16_MANT_MASK))
    sign_mis = match & (mant_err <= SIGN_MANT_TOL) & (((claimed ^ got) & BF16_SIGN_MASK) != 0)
    count = match.sum(axis=1)
    sums = np.where(match, mant_err, 0).sum(axis=1)
    ordered = np.sort(np.where(match, mant_err, np.iinfo(np.int64).max), axis=1)
    out = []
    for r in range(claimed.shape[0]):
        c = int(count[r])
        if c == 0:
            mean = median = NO_MATCH
        else:
            mean = float(sums[r]) / c
            median = float(ordered[r, c // 2])
        out.append(
            ChunkResult(
                exp_mismatches=int(claimed.shape[1] - c),
                mant_err_mean=mean,
                mant_err_median=median,
                sign_mismatches=int(sign_mis[r].sum()),
                points=int(claimed.shape[1]),
            )
        )
    return out
