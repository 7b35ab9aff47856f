"""Seeded Gumbel-max sampling that a verifier can replay token by token.

What this module owns: the one rule by which an inference worker turns a row of logits
into a token, and the log-probability it records for that token. What it never does:
touch torch's (or numpy's) global RNG, read a clock, or depend on batch layout.

The rule, for generated token number `step` (0-based, counted within the completion) of
a sample whose record carries `seed` (an unsigned 64-bit integer):

1. Noise. `u[v]` for every vocabulary entry `v` comes from Philox4x32-10 (Salmon et al.,
   "Parallel random numbers: as easy as 1, 2, 3", SC'11), a counter-based generator:
   key = (seed mod 2^32, seed >> 32), counter = (v // 4, step, 0, 0x47554D42 "GUMB");
   `u[v]` is word `v % 4` of that block, mapped to (word + 0.5) / 2^32 (never 0 or 1).
   Integer arithmetic only, so every machine (and a GPU) produces the same words.
2. Gumbel noise `g = -log(-log(u))`, computed in float64 and rounded to float32. (libm
   implementations may differ by one float64 ulp; the float32 result then differs with
   probability about 2^-28 per entry, far below the logit noise a verifier tolerates.)
3. Scores: `z = logits_f32 / temperature` (float32). Top-k then top-p filtering on `z`
   (order: descending `z`, ties broken by lower token id): top-k keeps the first k; top-p
   keeps the shortest prefix whose probability mass reaches `top_p` (softmax of the
   top-k survivors, float64). Filtered entries get -inf.
4. Token = argmax(z + g) (first index on ties). Temperature 0 means greedy: argmax(logits).
5. Recorded log-prob = log_softmax(z over the kept entries)[token] in float64, stored as
   float32: the log-probability of the token under the distribution actually sampled
   (0.0 for greedy). RL's importance ratios use it.

Disabled filters: `top_k <= 0` or `top_k >= vocab`, `top_p >= 1.0`.

Public API (numpy in, numpy out; torch CPU tensors are accepted and converted):
`philox4x32`, `gumbel_noise(seed, step, vocab_size)`, `gumbel_noise_batch(seeds, steps,
vocab_size)`, `filter_mask`, `perturbed_scores`, `sample_token`, `sample_tokens`.
`gumbel_noise_torch` produces the same noise as a torch tensor on any device (for GPU
engines) with the portable integer core of `philox4x32` (int64 with 16-bit partial
products, as torch has no full uint64 arithmetic); `gumbel_noise_batch` runs the same
rounds on numpy uint64, where a 32 x 32-bit product is exact in one multiplication.
The torch side of the rule, on the logits' device: `noise_rows` (the noise of rows on a
device), `filter_mask_torch`, `scale_torch` (step 3's z), `kept_logprobs_torch` (step 5
for given tokens, no noise needed) and `sample_tokens_torch` (steps 1-5, what a GPU
engine runs instead of copying its logits to numpy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "DOMAIN",
    "philox4x32",
    "gumbel_noise",
    "gumbel_noise_batch",
    "gumbel_noise_torch",
    "filter_mask",
    "perturbed_scores",
    "sample_token",
    "sample_tokens",
    "noise_rows",
    "filter_mask_torch",
    "scale_torch",
    "kept_logprobs_torch",
    "sample_tokens_torch",
]

DOMAIN = 0x47554D42  # "GUMB": the fourth counter word, separates this use of the seed
_M32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_TWO32 = 4294967296.0


def _mulhilo(a: Any, m: int) -> tuple[Any, Any]:
    """(hi, lo) 32-bit halves of a * m for int64 arrays a < 2^32 and a constant m < 2^32.

    Split into 16-bit partial products so no intermediate exceeds 2^50: works the same
    for numpy int64 and torch int64 without relying on wrap-around.
    """
    p_lo = a * (m & 0xFFFF)  # < 2^48
    p_hi = a * (m >> 16)  # < 2^48
    mid = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2^49
    lo = mid & _M32
    hi = ((p_hi >> 16) + (mid >> 32)) & _M32
    return hi, lo


def _philox_core(c0: Any, c1: Any, c2: Any, c3: Any, k0: Any, k1: Any, rounds: int = 10):
    """Philox4x32 over int64 arrays holding uint32 values (numpy or torch, broadcastable)."""
    for r in range(rounds):
        if r:
            k0 = (k0 + _PHILOX_W0) & _M32
            k1 = (k1 + _PHILOX_W1) & _M32
        hi0, lo0 = _mulhilo(c0, _PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox4x32(counter: Sequence[int], key: Sequence[int], rounds: int = 10) -> tuple[int, ...]:
    """One Philox4x32 block: four uint32 counter words and two key words → four words.

    Matches the Random123 known-answer vectors (see tests/test_verify_sampling.py).
    """
    c = [np.int64(int(x) & _M32) for x in counter]
    k = [np.int64(int(x) & _M32) for x in key]
    out = _philox_core(c[0], c[1], c[2], c[3], k[0], k[1], rounds)
    return tuple(int(x) for x in out)


def _check_seed(seed: int) -> int:
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"sampling seed must be an unsigned 64-bit integer, got {seed}")
    return seed


def seed_array(seeds: Sequence[int] | np.ndarray) -> np.ndarray:
    """Sampling seeds as a numpy uint64 array, each checked to be an unsigned 64-bit int."""
    return np.array([_check_seed(s) for s in seeds], dtype=np.uint64)


def _check_step(step: int) -> int:
    step = int(step)
    if not 0 <= step < 2**32:
        raise ValueError(f"sampling step must be in [0, 2^32), got {step}")
    return step


def _gumbel_from_words(words: np.ndarray) -> np.ndarray:
    u = words.astype(np.float64)
    u += 0.5
    u /= _TWO32
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)
    return u.astype(np.float32)


def gumbel_noise(seed: int, step: int, vocab_size: int) -> np.ndarray:
    """Gumbel(0, 1) noise, float32 [vocab_size], for one (seed, step)."""
    return gumbel_noise_batch([seed], [step], vocab_size)[0]


def gumbel_noise_batch(
    seeds: Sequence[int] | np.ndarray, steps: Sequence[int] | np.ndarray | int, vocab_size: int
) -> np.ndarray:
    """Gumbel noise, float32 [B, vocab_size]; row b uses (seeds[b], steps[b]). Seeds may
    be a numpy uint64 array and steps a numpy integer array (checked as a whole)."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if isinstance(seeds, np.ndarray) and seeds.dtype == np.uint64:
        seed_arr = seeds  # every uint64 is a valid seed
    else:  # Python ints up to 2^64 - 1 convert to uint64 exactly
        seed_arr = seed_array(seeds)
    if isinstance(steps, int | np.integer):
        st = np.full(len(seed_arr), _check_step(steps), dtype=np.uint64)
    elif isinstance(steps, np.ndarray) and np.issubdtype(steps.dtype, np.integer):
        if steps.size and not (int(steps.min()) >= 0 and int(steps.max()) < 2**32):
            raise ValueError(
                f"sampling steps must be in [0, 2^32), got {int(steps.min())}..{int(steps.max())}"
            )
        st = steps.astype(np.uint64)
    else:
        st = np.array([_check_step(s) for s in steps], dtype=np.uint64)
    if st.shape != seed_arr.shape or seed_arr.ndim != 1:
        raise ValueError("seeds and steps differ in length")
    lo, hi = seed_arr & np.uint64(_M32), seed_arr >> np.uint64(32)
    out = np.empty((len(seed_arr), vocab_size), dtype=np.float32)
    rows = max(1, CACHE_SLICE_VALUES // vocab_size)
    for a in range(0, len(seed_arr), rows):
        b = min(a + rows, len(seed_arr))
        out[a:b] = _gumbel_from_words(_words_np(lo[a:b], hi[a:b], st[a:b], vocab_size))
    return out


# Values per slice of rows: a slice's arrays (noise, words, scores) stay in cache.
CACHE_SLICE_VALUES = 131_072


def _philox_np(
    c0: np.ndarray, c1_in: np.ndarray, k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, ...]:
    """`_philox_core` for numpy uint64 arrays holding uint32 values, with counter words
    (c0, c1, 0, DOMAIN), c0 the block index [1, blocks] and c1, k0, k1 per row [rows, 1]:
    a product of two 32-bit words fits uint64 exactly, so each multiplication is one
    operation (the portable core splits it in four). The first round is taken apart: its
    product with c2 = 0 is 0, and its product with c0 is the same for every row."""
    m0, m1, w0, w1 = (np.uint64(x) for x in (_PHILOX_M0, _PHILOX_M1, _PHILOX_W0, _PHILOX_W1))
    m32, s32 = np.uint64(_M32), np.uint64(32)
    p0 = c0 * m0
    c0, c2, c3 = c1_in ^ k0, (p0 >> s32) ^ np.uint64(DOMAIN) ^ k1, p0 & m32  # round 0; its c1 is 0
    c1: np.ndarray | None = None
    for _ in range(9):
        k0 = (k0 + w0) & m32
        k1 = (k1 + w1) & m32
        p0 = c0 * m0
        p1 = c2 * m1
        hi1 = p1 >> s32
        if c1 is not None:
            hi1 ^= c1
        hi1 ^= k0
        p1 &= m32
        hi0 = p0 >> s32
        hi0 = hi0 ^ c3
        hi0 ^= k1
        p0 &= m32
        c0, c1, c2, c3 = hi1, p1, hi0, p0
    assert c1 is not None  # set by every round after the first
    return c0, c1, c2, c3


def _words_np(lo: np.ndarray, hi: np.ndarray, steps: np.ndarray, vocab_size: int) -> np.ndarray:
    """Philox words [B, vocab_size] (uint64 holding uint32) of rows (seed lo, seed hi, step)."""
    n_blocks = (vocab_size + 3) // 4
    blocks = np.arange(n_blocks, dtype=np.uint64)[None, :]
    w = _philox_np(blocks, steps[:, None], lo[:, None], hi[:, None])
    words = np.empty((len(lo), n_blocks, 4), dtype=np.uint64)
    for j in range(4):
        words[:, :, j] = w[j]
    return words.reshape(len(lo), n_blocks * 4)[:, :vocab_size]


def gumbel_noise_torch(
    seeds: Sequence[int], steps: Sequence[int], vocab_size: int, device: Any = "cpu"
):
    """The same noise as `gumbel_noise_batch`, as a float32 torch tensor on `device`."""
    import torch  # deferred: heavy import

    seed_list = [_check_seed(s) for s in seeds]
    step_list = [_check_step(s) for s in steps]
    n_blocks = (vocab_size + 3) // 4
    i64 = torch.int64
    blocks = torch.arange(n_blocks, dtype=i64, device=device)[None, :]
    lo = torch.tensor([x & _M32 for x in seed_list], dtype=i64, device=device)[:, None]
    hi = torch.tensor([x >> 32 for x in seed_list], dtype=i64, device=device)[:, None]
    st = torch.tensor(step_list, dtype=i64, device=device)[:, None]
    zeros = torch.zeros_like(blocks)
    dom = torch.full_like(blocks, DOMAIN)
    w = _philox_core(blocks, st + zeros, zeros, dom, lo, hi)
    w = torch.broadcast_tensors(*w)
    words = torch.stack(w, dim=-1).reshape(len(seed_list), n_blocks * 4)[:, :vocab_size]
    u = (words.to(torch.float64) + 0.5) / _TWO32
    return (-torch.log(-torch.log(u))).to(torch.float32)


def _as_f32(logits: Any) -> np.ndarray:
    if hasattr(logits, "detach"):  # a torch tensor
        logits = logits.detach().to("cpu").float().numpy()
    return np.asarray(logits, dtype=np.float32)


def filter_mask(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Boolean keep-mask [B, V] for scaled logits z [B, V] (rule step 3)."""
    b, v = z.shape
    use_k = 0 < top_k < v
    use_p = top_p < 1.0
    if not (use_k or use_p):
        return np.isfinite(z) | (z == np.inf)
    order = np.argsort(-z, axis=-1, kind="stable")  # descending, ties → lower id first
    zs = np.take_along_axis(z, order, axis=-1)
    keep_sorted = np.ones((b, v), dtype=bool)
    if use_k:
        keep_sorted[:, top_k:] = False
    if use_p:
        zz = np.where(keep_sorted, zs.astype(np.float64), -np.inf)
        zz = zz - zz[:, :1]
        p = np.exp(zz)
        p /= p.sum(axis=-1, keepdims=True)
        before = np.cumsum(p, axis=-1) - p  # mass strictly before each entry
        keep_sorted &= before < top_p
        keep_sorted[:, 0] = True
    keep_sorted &= zs > -np.inf
    keep_sorted[:, 0] = True
    mask = np.zeros((b, v), dtype=bool)
    np.put_along_axis(mask, order, keep_sorted, axis=-1)
    return mask


def _validate_settings(temperature: float, top_p: float, top_k: int) -> None:
    if not (temperature >= 0.0 and np.isfinite(temperature)):
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if int(top_k) != top_k:
        raise ValueError(f"top_k must be an integer, got {top_k}")


def perturbed_scores(
    logits: Any,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    seeds: Sequence[int] | np.ndarray,
    steps: Sequence[int] | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, z) for logits [B, V]: scores = z + gumbel with filtered entries at -inf.

    A verifier replaying a record can look at `scores.max() - scores[token]` (the margin
    by which the recorded token lost, 0 when it is the argmax) instead of exact equality.
    Not defined for temperature 0 (greedy has no noise; compare logits directly).
    """
    _validate_settings(temperature, top_p, top_k)
    if temperature == 0.0:
        raise ValueError("perturbed_scores needs temperature > 0")
    x = _as_f32(logits)
    if x.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {x.shape}")
    z = (x / np.float32(temperature)).astype(np.float32, copy=False)
    keep = filter_mask(z, int(top_k), float(top_p))
    scores = gumbel_noise_batch(seeds, steps, x.shape[1])
    scores += z
    if keep.all():  # no filter removed anything (the common case: top_p = 1, top_k = 0)
        return scores, z
    scores[~keep] = -np.inf
    return scores, np.where(keep, z, np.float32(-np.inf))


def sample_tokens(
    logits: Any,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    seeds: Sequence[int],
    steps: Sequence[int] | int,
) -> tuple[np.ndarray, np.ndarray]:
    """Batched rule: logits [B, V] → (tokens int64 [B], sampler log-probs float32 [B])."""
    x = _as_f32(logits)
    if x.ndim != 2:
        raise ValueError(f"logits must be [B, V], got shape {x.shape}")
    b = x.shape[0]
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for {b} rows")
    step_list = [int(steps)] * b if isinstance(steps, int | np.integer) else list(steps)
    _validate_settings(temperature, top_p, top_k)
    if temperature == 0.0:
        return np.argmax(x, axis=-1).astype(np.int64), np.zeros(b, dtype=np.float32)
    scores, zk = perturbed_scores(
        x, temperature=temperature, top_p=top_p, top_k=top_k, seeds=seeds, steps=step_list
    )
    tokens = np.argmax(scores, axis=-1).astype(np.int64)
    z64 = zk.astype(np.float64)
    zmax = z64.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z64 - zmax).sum(axis=-1)) + zmax[:, 0]
    logprobs = (z64[np.arange(b), tokens] - lse).astype(np.float32)
    return tokens, logprobs


def sample_token(
    logits: Any,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int,
    step: int,
) -> tuple[int, float]:
    """One row: logits [V] → (token, sampler log-prob as a float32 value)."""
    x = _as_f32(logits)
    if x.ndim != 1:
        raise ValueError(f"logits must be [V], got shape {x.shape}")
    t, lp = sample_tokens(
        x[None, :], temperature=temperature, top_p=top_p, top_k=top_k, seeds=[seed], steps=[step]
    )
    return int(t[0]), float(lp[0])


# ------------------------------------------------------------------ torch, on any device


def noise_rows(seeds: Any, steps: Any, vocab_size: int, device: Any):
    """The rule's noise for rows (seeds[b], steps[b]) as float32 [rows, vocab_size] on
    `device`: the numpy rounds on a CPU (`gumbel_noise_batch`, faster there), torch's
    portable rounds on any other device (`gumbel_noise_torch`); the same values."""
    import torch  # deferred: heavy import

    if torch.device(device).type == "cpu":
        return torch.from_numpy(gumbel_noise_batch(seeds, steps, vocab_size))
    return gumbel_noise_torch(
        [int(s) for s in seeds], [int(s) for s in steps], vocab_size, device=device
    )


def filter_mask_torch(z: Any, top_k: int, top_p: float):
    """Rule step 3 for scaled logits z [B, V] (a torch tensor on any device): the boolean
    keep-mask, as `filter_mask`."""
    import torch  # deferred: heavy import

    b, v = z.shape
    use_k, use_p = 0 < top_k < v, top_p < 1.0
    if not (use_k or use_p):
        return ~torch.isnan(z) & (z > float("-inf"))
    order = torch.sort(-z, dim=-1, stable=True).indices  # descending, ties → lower id
    zs = torch.gather(z, -1, order)
    keep = torch.ones((b, v), dtype=torch.bool, device=z.device)
    if use_k:
        keep[:, top_k:] = False
    if use_p:
        zz = torch.where(keep, zs.double(), torch.full_like(zs, float("-inf"), dtype=torch.float64))
        p = torch.exp(zz - zz[:, :1])
        p = p / p.sum(dim=-1, keepdim=True)
        before = torch.cumsum(p, dim=-1) - p  # mass strictly before each entry
        keep &= before < top_p
        keep[:, 0] = True
    keep &= zs > float("-inf")
    keep[:, 0] = True
    return torch.zeros_like(keep).scatter(-1, order, keep)


def scale_torch(logits: Any, temperature: float, top_p: float, top_k: int):
    """(z, keep) for logits [B, V] on any device: z = float32 logits / float32 temperature
    (as `perturbed_scores`), keep the filter mask, None when no filter applies."""
    import torch  # deferred: heavy import

    x = logits.float()
    z = x / torch.tensor(temperature, dtype=torch.float32, device=x.device)
    v = z.shape[-1]
    if not (0 < top_k < v or top_p < 1.0):
        return z, None
    return z, filter_mask_torch(z, int(top_k), float(top_p))


def kept_logprobs_torch(z: Any, keep: Any, tokens: Any):
    """Rule step 5 for given tokens [B] (int64, in the vocabulary) of scaled logits z
    [B, V]: log_softmax over the kept entries at the token, float64 [B] (-inf where the
    token was filtered out). Needs the filter mask only, never the noise."""
    import torch  # deferred: heavy import

    z64 = z.double()
    if keep is not None:
        z64 = z64.masked_fill(~keep, float("-inf"))
    zmax = z64.max(dim=1, keepdim=True).values
    lse = torch.log(torch.exp(z64 - zmax).sum(dim=1)) + zmax[:, 0]
    return z64.gather(1, tokens[:, None])[:, 0] - lse


def sample_tokens_torch(
    logits: Any,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    seeds: Sequence[int],
    steps: Sequence[int] | int,
) -> tuple[np.ndarray, np.ndarray]:
    """`sample_tokens` on the logits' device: logits [B, V] (torch) → (tokens int64 [B],
    sampler log-probs float32 [B]) as numpy; only the two per-row results leave the device."""
    import torch  # deferred: heavy import

    b = logits.shape[0]
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} seeds for {b} rows")
    step_list = [int(steps)] * b if isinstance(steps, int | np.integer) else list(steps)
    _validate_settings(temperature, top_p, top_k)
    if temperature == 0.0:
        tok = torch.argmax(logits.float(), dim=-1)
        return tok.cpu().numpy().astype(np.int64), np.zeros(b, dtype=np.float32)
    z, keep = scale_torch(logits, temperature, top_p, top_k)
    scores = z + noise_rows(seed_array(seeds), np.asarray(step_list), z.shape[-1], z.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    tok = torch.argmax(scores, dim=-1)  # first index on ties
    lp = kept_logprobs_torch(z, keep, tok)
    return tok.cpu().numpy().astype(np.int64), lp.cpu().numpy().astype(np.float32)
