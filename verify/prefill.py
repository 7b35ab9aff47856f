"""Running the claimed model over rollouts for an audit: hidden states and logits.

What this module owns: one prefill of prompt + completion per rollout, batched across
rollouts (right padding, so real tokens keep their positions; up to `max_batch_tokens`
padded tokens a batch, `CPU_BATCH_TOKENS` on a CPU; rollouts of similar length share a
batch), giving for each rollout the final hidden states [T, H] and float32 logits [T, V] at
the positions that chose its T completion tokens. `prefill_shared` computes every token
prefix that several rollouts share once (a GRPO group's prompt, equal completion starts).
It never loads a model and never judges anything (`verify.auditor` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_MAX_BATCH_TOKENS = 16_384
# On a CPU, batches of this many tokens at most: a layer's activations then stay in the
# core's cache, and rollouts sorted by length pad little. Larger batches cost more per token.
CPU_BATCH_TOKENS = 1_024

def batch_tokens(model: Any, max_batch_tokens: int) -> int:
    """The padded tokens of one prefill batch: `max_batch_tokens`, at most
    `CPU_BATCH_TOKENS` for a model on a CPU."""
    if model.get_output_embeddings().weight.device.type == "cpu":
        return min(max_batch_tokens, CPU_BATCH_TOKENS)
    return max_batch_tokens


def _batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that (batch size x longest) <= max_batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) + 1) * longest > max_batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


@torch.inference_mode()
def prefill(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    padding_side: str = "right",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each (prompt_ids, completion_ids): (hidden [T, H] in the model's dtype, logits
    [T, V] float32) at the positions that chose the T completion tokens.

    Right padding keeps every real token at its own position with no position ids;
    left padding passes explicit position ids starting at 0 for each sequence."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    base = model.base_model
    head = model.get_output_embeddings()
    device = head.weight.device
    lengths = [len(p) + len(c) for p, c in sequences]
    rows_of: dict[int, torch.Tensor] = {}
    for batch in _batches(lengths, batch_tokens(model, max_batch_tokens)):
        width = max(lengths[i] for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        offsets = []
        for r, i in enumerate(batch):
            p, c = sequences[i]
            seq = torch.tensor(list(p) + list(c), dtype=torch.long)
            off = width - len(seq) if padding_side == "left" else 0
            ids[r, off : off + len(seq)] = seq
            mask[r, off : off + len(seq)] = 1
            offsets.append(off)
        kwargs: dict[str, Any] = {}
        if padding_side == "left":
            kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
        out = base(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False, **kwargs)
        h = out.last_hidden_state
        for r, i in enumerate(batch):
            p, c = sequences[i]
            start = offsets[r] + len(p) - 1
            rows_of[i] = h[r, start : start + len(c)]
    if not sequences:
        return []
    return _with_logits(head, torch.cat([rows_of[i] for i in range(len(sequences))]), [len(c) for _, c in sequences])


def _cache_kwarg(model: Any) -> str:
    import inspect

    params = inspect.signature(model.base_model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def prefill_shared(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`prefill`, computing each distinct prompt once (a GRPO group's rollouts share one).

    Pass 1 prefills the distinct prompts (right-padded batches) and keeps their keys and
    values; its last prompt row is the hidden state that chose completion token 0. Pass 2
    runs the completions (all but their last token) on top of their prompt's cache, with
    explicit positions and the prompt padding masked out, in batches of similar completion
    length (few padded rows). Same values as `prefill` up to float reordering; a group of
    g rollouts costs one prompt instead of g, and equal rollouts cost one prefill.
    """
    from transformers import DynamicCache

    if not sequences:
        return []
    distinct: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    index = [distinct.setdefault((tuple(p), tuple(c)), len(distinct)) for p, c in sequences]
    if len(distinct) < len(sequences):  # equal rollouts (a confident policy's group) once
        once = prefill_shared(model, list(distinct), max_batch_tokens)
        return [once[k] for k in index]
    base = model.base_model
    device = model.get_output_embeddings().weight.device
    cache_kw = _cache_kwarg(model)
    prompts: dict[tuple[int, ...], int] = {}
    prompt_of = [prompts.setdefault(tuple(p), len(prompts)) for p, _ in sequences]
    uniq = list(prompts)
    max_batch_tokens = batch_tokens(model, max_batch_tokens)
    keys, values, last_rows = _prefill_prompts(base, uniq, max_batch_tokens, cache_kw, device)
    rest = [i for i, (_, c) in enumerate(sequences) if len(c) > 1]
    rows_of: dict[int, torch.Tensor] = {}
    for batch in _batches([len(sequences[i][1]) - 1 for i in rest], max_batch_tokens):
        items = [rest[k] for k in batch]
        lp = max(len(uniq[prompt_of[i]]) for i in items)
        lc = max(len(sequences[i][1]) - 1 for i in items)
        ids, mask, pos = [], [], []
        for i in items:
            n, c = len(uniq[prompt_of[i]]), list(sequences[i][1][:-1])
            ids.append(c + [0] * (lc - len(c)))
            mask.append([1] * n + [0] * (lp - n) + [1] * len(c) + [0] * (lc - len(c)))
            pos.append(list(range(n, n + lc)))
        which = torch.tensor([prompt_of[i] for i in items], device=device)
        cache = DynamicCache()
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            cache.update(k[which, :, :lp], v[which, :, :lp], layer)
        out = base(
            input_ids=torch.tensor(ids, device=device), attention_mask=torch.tensor(mask, device=device),
            position_ids=torch.tensor(pos, device=device), use_cache=True, **{cache_kw: cache},
        )
        for r, i in enumerate(items):
            rows_of[i] = out.last_hidden_state[r, : len(sequences[i][1]) - 1]
    pieces = []
    for i, u in enumerate(prompt_of):
        pieces.append(last_rows[u : u + 1])
        if i in rows_of:
            pieces.append(rows_of[i])
    return _with_logits(model.get_output_embeddings(), torch.cat(pieces), [len(c) for _, c in sequences])


def _prefill_prompts(
    base: Any, prompts: list[tuple[int, ...]], max_batch_tokens: int, cache_kw: str, device: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Pass 1 of `prefill_shared`: per layer, the keys and values of every prompt
    [prompts, heads, longest prompt, head dim] (zero past each prompt's end), and the
    hidden state of each prompt's last token [prompts, H]."""
    from transformers import DynamicCache

    longest = max(len(p) for p in prompts)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    last_rows: torch.Tensor | None = None
    for batch in _batches([len(p) for p in prompts], max_batch_tokens):
        width = max(len(prompts[u]) for u in batch)
        lens = torch.tensor([len(prompts[u]) for u in batch], device=device)
        ids = torch.tensor([list(prompts[u]) + [0] * (width - len(prompts[u])) for u in batch], device=device)
        mask = torch.arange(width, device=device)[None, :] < lens[:, None]
        cache = DynamicCache()
        out = base(input_ids=ids, attention_mask=mask.long(), use_cache=True, **{cache_kw: cache})
        h = out.last_hidden_state
        if last_rows is None:
            last_rows = h.new_zeros((len(prompts), h.shape[-1]))
        where = torch.tensor(batch, device=device)
        last_rows[where] = h[torch.arange(len(batch), device=device), lens - 1]
        real = mask[:, None, :, None]
        for layer, kv in enumerate(cache.layers):
            if layer == len(keys):
                shape = (len(prompts), kv.keys.shape[1], longest, kv.keys.shape[3])
                keys.append(kv.keys.new_zeros(shape))
                values.append(kv.values.new_zeros(shape))
            keys[layer][where, :, :width] = torch.where(real, kv.keys, 0.0)
            values[layer][where, :, :width] = torch.where(real, kv.values, 0.0)
    assert last_rows is not None
    return keys, values, last_rows


def _with_logits(head: Any, hidden: torch.Tensor, counts: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden, logits) per sequence from the rows of all sequences in order [sum(counts),
    H], the LM head applied once to all rows."""
    if not counts:
        return []
    logits = head(hidden).float().cpu()
    hidden = hidden.cpu()
    out, start = [], 0
    for n in counts:
        out.append((hidden[start : start + n], logits[start : start + n]))
        start += n
    return out


