"""Running the claimed model over rollouts for an audit: hidden states and logits.

What this module owns: one prefill of prompt + completion per rollout, batched across
rollouts (right padding, so real tokens keep their positions; up to `max_batch_tokens`
padded tokens a batch, `CPU_BATCH_TOKENS` on a CPU; rollouts of similar length share a
batch), giving for each rollout the final hidden states [T, H] at the positions that chose
its T completion tokens (`hidden_rows`, on the model's device; `verify.head` applies the
LM head to them in row chunks), or those and float32 logits [T, V] (`prefill`, for small
inputs: it holds every row's logits at once). `prefill_shared` computes every token
prefix that several rollouts share once (a GRPO group's prompt, equal completion starts).
It never loads a model and never judges anything (`verify.auditor` does).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
    [T, V] float32) at the positions that chose the T completion tokens, on the CPU.

    Right padding keeps every real token at its own position with no position ids;
    left padding passes explicit position ids starting at 0 for each sequence. Holds the
    logits of every sequence at once: audits and workers take `hidden_rows` and apply the
    head in chunks (`verify.head`)."""
    rows = _prefill_rows(model, sequences, max_batch_tokens, padding_side)
    return _with_logits(model.get_output_embeddings(), rows, [len(c) for _, c in sequences])


@torch.inference_mode()
def hidden_rows(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    padding_side: str = "right",
    share_prompts: bool = True,
) -> torch.Tensor:
    """The final hidden states that chose the completion tokens, [sum of completion
    lengths, H] in the model's dtype on its device, sequence after sequence: `prefill`'s
    hidden rows without logits (`prefill_shared`'s when `share_prompts` and right padding)."""
    if share_prompts and padding_side == "right":
        return _prefill_shared_rows(model, sequences, max_batch_tokens)
    return _prefill_rows(model, sequences, max_batch_tokens, padding_side)


def _prefill_rows(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int,
    padding_side: str,
) -> torch.Tensor:
    """`prefill`'s hidden rows [sum of completion lengths, H], on the model's device."""
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
        out = base(
            input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False, **kwargs
        )
        h = out.last_hidden_state
        for r, i in enumerate(batch):
            p, c = sequences[i]
            start = offsets[r] + len(p) - 1
            rows_of[i] = h[r, start : start + len(c)]
    if not sequences:
        return head.weight.new_zeros((0, head.weight.shape[1]))
    return torch.cat([rows_of[i] for i in range(len(sequences))])


def _cache_kwarg(model: Any) -> str:
    params = inspect.signature(model.base_model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# A row of pass 2 of `prefill_shared` holds at most this many completion tokens (unless
# one completion is longer): attention within a row is dense under its tree mask.
SHARED_ROW_TOKENS = 256


@torch.inference_mode()
def prefill_shared(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`prefill`, computing every token prefix that several rollouts share once (a GRPO
    group's prompt, equal completion starts, equal rollouts).

    Pass 1 prefills the distinct prompts (right-padded batches) and keeps their keys and
    values; its last prompt row is the hidden state that chose completion token 0. Pass 2
    runs the completions (all but their last token) on top of their prompt's cache, with
    explicit positions: the completions of one prompt as a prefix tree (each distinct
    start once; a tree mask lets a token see exactly its own prefix and the prompt), in
    rows of at most `SHARED_ROW_TOKENS` tokens, rows of similar size batched together.
    Same values as `prefill` up to float reordering. Models with other than full
    attention layers (sliding windows) take `prefill`.
    """
    if not sequences:
        return []
    rows = _prefill_shared_rows(model, sequences, max_batch_tokens)
    return _with_logits(model.get_output_embeddings(), rows, [len(c) for _, c in sequences])


def _prefill_shared_rows(
    model: Any,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_batch_tokens: int,
) -> torch.Tensor:
    """`prefill_shared`'s hidden rows [sum of completion lengths, H], on the model's device."""
    if not sequences or any(
        t != "full_attention" for t in getattr(model.config, "layer_types", None) or ()
    ):
        return _prefill_rows(model, sequences, max_batch_tokens, "right")
    base = model.base_model
    device = model.get_output_embeddings().weight.device
    prompts: dict[tuple[int, ...], int] = {}
    prompt_of = [prompts.setdefault(tuple(p), len(prompts)) for p, _ in sequences]
    uniq = list(prompts)
    max_batch_tokens = batch_tokens(model, max_batch_tokens)
    cache_kw = _cache_kwarg(model)
    keys, values, last_rows = _prefill_prompts(base, uniq, max_batch_tokens, cache_kw, device)
    by_prompt: dict[int, list[int]] = {}
    for i, u in enumerate(prompt_of):
        by_prompt.setdefault(u, []).append(i)
    rows: list[tuple[int, _TreeRow]] = []  # (prompt, its completions' tree row)
    for u, idx in by_prompt.items():
        for row in _tree_rows([list(sequences[i][1][:-1]) for i in idx], SHARED_ROW_TOKENS):
            if row.tokens:
                row.paths = [(idx[k], path) for k, path in row.paths]
                rows.append((u, row))
    rows_of: dict[int, torch.Tensor] = {}
    for batch in _batches([len(r.tokens) for _, r in rows], max_batch_tokens):
        items = [rows[k] for k in batch]
        rows_of.update(
            _tree_pass(base, items, [len(uniq[u]) for u, _ in items], (keys, values), cache_kw)
        )
    pieces = []
    for i, u in enumerate(prompt_of):
        pieces.append(last_rows[u : u + 1])
        if i in rows_of:
            pieces.append(rows_of[i])
    return torch.cat(pieces)


def _tree_pass(
    base: Any,
    items: list[tuple[int, _TreeRow]],
    prompt_lens: list[int],
    prompt_cache: tuple[list[torch.Tensor], list[torch.Tensor]],
    cache_kw: str,
) -> dict[int, torch.Tensor]:
    """Pass 2 of `prefill_shared` for one batch of (prompt, tree row): per sequence, the
    hidden states of its completion tokens but the last [n - 1, H]."""
    from transformers import DynamicCache  # deferred: heavy import

    lp, lc = max(prompt_lens), max(len(r.tokens) for _, r in items)
    ids = np.zeros((len(items), lc), dtype=np.int64)
    pos = np.zeros((len(items), lc), dtype=np.int64)
    mask = np.zeros((len(items), 1, lc, lp + lc), dtype=bool)
    mask[:, 0, np.arange(lc), lp + np.arange(lc)] = True  # padding sees itself only
    for b, ((_, row), n) in enumerate(zip(items, prompt_lens, strict=True)):
        t = len(row.tokens)
        ids[b, :t] = row.tokens
        pos[b, :t] = np.asarray(row.positions) + n
        mask[b, 0, :t, :n] = True
        mask[b, 0, :t, lp : lp + t] = row.mask
    device = prompt_cache[0][0].device
    which = torch.tensor([u for u, _ in items], device=device)
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(*prompt_cache, strict=True)):
        cache.update(k[which, :, :lp], v[which, :, :lp], layer)
    # an additive mask (0 or -inf) in the model's dtype: sdpa converts a boolean one itself
    additive = torch.zeros(mask.shape, dtype=prompt_cache[0][0].dtype)
    additive.masked_fill_(torch.from_numpy(~mask), float("-inf"))
    out = base(
        input_ids=torch.from_numpy(ids).to(device),
        attention_mask=additive.to(device),
        position_ids=torch.from_numpy(pos).to(device),
        use_cache=True,
        **{cache_kw: cache},
    )
    h = out.last_hidden_state
    return {i: h[b, path] for b, (_, row) in enumerate(items) for i, path in row.paths if len(path)}


@dataclass
class _TreeRow:
    """A prefix tree laid out as one row, nodes in depth-first order: `tokens` and
    `positions` per node, `mask[j, k]` when node k is on node j's prefix (itself included),
    and per sequence (its index, the nodes of its prefixes in order)."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    blocks: list[tuple[int, np.ndarray, int]] = field(
        default_factory=list
    )  # (first new node, path, shared)
    paths: list[tuple[int, np.ndarray]] = field(default_factory=list)

    @property
    def mask(self) -> np.ndarray:
        n = len(self.tokens)
        m = np.zeros((n, n), dtype=bool)
        for first, path, shared in self.blocks:
            # the new nodes path[shared:] see path[: depth + 1] each
            depth = np.arange(shared, len(path))
            m[first : first + len(depth), path] = np.arange(len(path))[None, :] <= depth[:, None]
        return m


def _tree_rows(fed: list[list[int]], row_tokens: int) -> list[_TreeRow]:
    """The sequences `fed` as prefix-tree rows: sorted, so that each one shares with its
    predecessor the longest prefix it shares with any earlier one; a row is closed when
    the next sequence's new nodes would take it past `row_tokens`."""
    rows = [_TreeRow()]
    prev: list[int] = []
    prev_path = np.zeros(0, dtype=np.int64)
    for i in sorted(range(len(fed)), key=lambda i: fed[i]):
        seq = fed[i]
        row = rows[-1]
        shared = _common_prefix(prev, seq)
        if row.tokens and len(row.tokens) + len(seq) - shared > row_tokens:
            row = _TreeRow()
            rows.append(row)
            shared = 0
        first = len(row.tokens)
        path = np.concatenate([prev_path[:shared], np.arange(first, first + len(seq) - shared)])
        row.tokens.extend(seq[shared:])
        row.positions.extend(range(shared, len(seq)))
        if shared < len(seq):
            row.blocks.append((first, path, shared))
        row.paths.append((i, path))
        prev, prev_path = seq, path
    return rows


def _common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _prefill_prompts(
    base: Any, prompts: list[tuple[int, ...]], max_batch_tokens: int, cache_kw: str, device: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Pass 1 of `prefill_shared`: per layer, the keys and values of every prompt
    [prompts, heads, longest prompt, head dim] (zero past each prompt's end), and the
    hidden state of each prompt's last token [prompts, H]."""
    from transformers import DynamicCache  # deferred: heavy import

    longest = max(len(p) for p in prompts)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    last_rows: torch.Tensor | None = None
    for batch in _batches([len(p) for p in prompts], max_batch_tokens):
        width = max(len(prompts[u]) for u in batch)
        lens = torch.tensor([len(prompts[u]) for u in batch], device=device)
        ids = torch.tensor(
            [list(prompts[u]) + [0] * (width - len(prompts[u])) for u in batch], device=device
        )
        mask = torch.arange(width, device=device)[None, :] < lens[:, None]
        cache = DynamicCache()
        out = base(input_ids=ids, attention_mask=mask.long(), use_cache=True, **{cache_kw: cache})
        h: torch.Tensor = out.last_hidden_state
        if last_rows is None:
            last_rows = h.new_zeros((len(prompts), h.shape[-1]))
        rows = last_rows
        where = torch.tensor(batch, device=device)
        rows[where] = h[torch.arange(len(batch), device=device), lens - 1]
        real = mask[:, None, :, None]
        # the layers of a DynamicCache after a forward pass hold key and value tensors
        layers: list[Any] = list(cache.layers)
        for layer, kv in enumerate(layers):
            if layer == len(keys):
                shape = (len(prompts), kv.keys.shape[1], longest, kv.keys.shape[3])
                keys.append(kv.keys.new_zeros(shape))
                values.append(kv.values.new_zeros(shape))
            keys[layer][where, :, :width] = torch.where(real, kv.keys, 0.0)
            values[layer][where, :, :width] = torch.where(real, kv.values, 0.0)
    assert last_rows is not None
    return keys, values, last_rows


def _with_logits(
    head: Any, hidden: torch.Tensor, counts: Sequence[int]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
