"""The LM head over hidden rows, in row chunks on the model's device, keeping per-token values.

What this module owns: turning the final hidden states of completion tokens (rows
[N, H] on the model's device, from `verify.prefill`) into what an audit or a worker's
record needs per token, without ever holding full-vocabulary logits for more than one
chunk of rows: the sampling replay's margins and the sampler log-probs
(`replay_hidden`, the verifier's), and the sampler log-probs of given tokens
(`logprobs_hidden`, a worker's record: the filter mask only, no noise). A chunk holds at
most `CHUNK_VALUES` logits (float32, with a few same-sized temporaries for the noise and
scores), so memory no longer grows with batch size x completion length x vocabulary.

The values are those of `verify.checks.replay` on the full logits: the same float32
logits per row (the head applied to a chunk of rows), the same noise
(`verify.sampling.noise_rows`), the same float32 scores, so margins are equal; log-probs
are float64 sums whose order may differ in the last bits. On a CPU each chunk's replay is
`verify.checks.replay_rows` (numpy, in slices of rows that stay in cache: faster there
than torch's full-chunk passes), so it is the full-logits replay's own code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verify import checks, sampling
from verify.checks import Replay

# Logits per chunk of rows: 2^22 float32 values (16 MiB; 27 rows of a 151,936-token
# vocabulary, 8,192 of a 512-token one). Big enough that a GPU's head matmul is efficient,
# small enough that the chunk's float64 log-softmax and noise stay far below a model's size.
CHUNK_VALUES = 1 << 22
# On a CPU, a chunk's replay runs the numpy rule (`verify.checks.replay_rows`); the torch
# one runs on every other device (tests set this False to check it on a CPU).
NUMPY_ON_CPU = True


def chunk_rows(vocab: int) -> int:
    """Rows per chunk for a vocabulary of `vocab` entries."""
    return max(1, CHUNK_VALUES // max(1, vocab))


def _logits(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits [rows, V] of hidden rows [rows, H], on the head's device."""
    dev = head.weight.device
    return head(hidden.to(dev)).float()


def _replay_chunk(
    x: torch.Tensor,
    tokens: torch.Tensor,
    seeds: np.ndarray,
    steps: np.ndarray,
    temperature: float,
    top_p: float,
    top_k: int,
    noise: bool,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(margins, log-probs), float64 [rows] on x's device, for float32 logits x [rows, V]
    and recorded tokens [rows] (ids >= V are out of the vocabulary: margin inf, log-prob
    nan); margins None when `noise` is False."""
    v = x.shape[1]
    in_vocab = tokens < v
    safe = torch.where(in_vocab, tokens, torch.zeros_like(tokens))
    if temperature == 0.0:
        margins = None
        if noise:
            chosen = x.gather(1, safe[:, None])[:, 0].double()
            margins = x.max(dim=1).values.double() - chosen
            margins = margins.masked_fill(~in_vocab, float("inf"))
        lp = torch.where(in_vocab, 0.0, float("nan")).double()
        return margins, lp
    z, keep = sampling.scale_torch(x, temperature, top_p, top_k)
    margins = None
    if noise:
        scores = z + sampling.noise_rows(seeds, steps, v, x.device)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        chosen = scores.gather(1, safe[:, None])[:, 0].double()
        margins = (scores.max(dim=1).values.double() - chosen) * temperature
        margins = margins.masked_fill(~in_vocab | ~torch.isfinite(chosen), float("inf"))
    lp = sampling.kept_logprobs_torch(z, keep, safe)
    lp = lp.masked_fill(~in_vocab | ~torch.isfinite(lp), float("nan"))
    return margins, lp


def _rows_of(
    head: Any,
    hidden: torch.Tensor,
    tokens: np.ndarray,
    seeds: np.ndarray,
    steps: np.ndarray,
    settings: tuple[float, float, int],
    noise: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(margins, log-probs) float64 numpy [N] of hidden rows [N, H] under one setting,
    the head applied chunk by chunk (margins all 0 when `noise` is False)."""
    n = hidden.shape[0]
    margins, lps = np.zeros(n), np.empty(n)
    step = chunk_rows(int(head.weight.shape[0]))
    dev = head.weight.device
    for a in range(0, n, step):
        b = min(a + step, n)
        x = _logits(head, hidden[a:b])
        if noise and NUMPY_ON_CPU and dev.type == "cpu" and settings[0] > 0.0:
            # on a CPU the numpy rule, in slices that stay in cache, is the faster one
            margins[a:b], lps[a:b] = checks.replay_rows(
                x.numpy(), tokens[a:b], seeds[a:b], steps[a:b], *settings
            )
            continue
        tok = torch.from_numpy(tokens[a:b]).to(dev)
        m, lp = _replay_chunk(x, tok, seeds[a:b], steps[a:b], *settings, noise=noise)
        if m is not None:
            margins[a:b] = m.cpu().numpy()
        lps[a:b] = lp.cpu().numpy()
    return margins, lps


Setting = tuple[float, float, int]  # (temperature, top_p, top_k)


def _run(
    head: Any,
    hidden: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    settings: Sequence[Setting],
    seeds: Sequence[int],
    noise: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(margins, log-probs) per sequence of `tokens`, its rows of `hidden` in order; rows
    of sequences with the same settings go through the head together, in chunks."""
    counts = [len(t) for t in tokens]
    if hidden.shape[0] != sum(counts):
        raise ValueError(f"{hidden.shape[0]} hidden rows for {sum(counts)} tokens")
    start = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    groups: dict[Setting, list[int]] = {}
    for i, s in enumerate(settings):
        groups.setdefault(s, []).append(i)
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(tokens)
    for setting, idx in groups.items():
        lengths = [counts[i] for i in idx]
        row_seeds = np.repeat(sampling.seed_array([seeds[i] for i in idx]), lengths)
        steps = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        toks = np.concatenate([np.asarray(tokens[i], dtype=np.int64) for i in idx])
        if len(idx) == len(tokens):
            sub = hidden
        else:
            rows = [torch.arange(start[i], start[i + 1]) for i in idx]
            sub = hidden.index_select(0, torch.cat(rows).to(hidden.device))
        margins, lps = _rows_of(head, sub, toks, row_seeds, steps, setting, noise)
        pos = 0
        for i, n in zip(idx, lengths, strict=True):
            out[i] = (margins[pos : pos + n], lps[pos : pos + n])
            pos += n
    return [r for r in out if r is not None]


@torch.inference_mode()
def replay_hidden(head: Any, hidden: torch.Tensor, bodies: Sequence[Any]) -> list[Replay]:
    """`verify.checks.replay_many` from hidden rows: `hidden` [sum of completion lengths,
    H] holds the rows that chose each body's completion tokens, body after body; the head
    is applied in chunks of `chunk_rows` rows on its device and only margins and
    log-probs are kept."""
    res = _run(
        head,
        hidden,
        [b.completion_ids for b in bodies],
        [(float(b.temperature), float(b.top_p), int(b.top_k)) for b in bodies],
        [b.sampling_seed for b in bodies],
        noise=True,
    )
    return [Replay(m, lp) for m, lp in res]


@torch.inference_mode()
def logprobs_hidden(
    head: Any,
    hidden: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    settings: Any,
    floor: float = -1e4,
) -> list[list[float]]:
    """Rule step 5 for tokens already chosen (a worker's recorded log-probs): per
    sequence, the log-prob of each token under the filtered, tempered distribution of
    its row (hidden rows [sum of lengths, H], sequence after sequence; `settings` has
    temperature, top_p and top_k), floored at `floor` (a token the filters removed), as
    float32 values; 0.0 when greedy. Only the filter mask is computed, never the noise."""
    s = (float(settings.temperature), float(settings.top_p), int(settings.top_k))
    res = _run(head, hidden, tokens, [s] * len(tokens), [0] * len(tokens), noise=False)
    return [
        np.maximum(np.nan_to_num(lp, nan=floor), floor).astype(np.float32).tolist() for _, lp in res
    ]
