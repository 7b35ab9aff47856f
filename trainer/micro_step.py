"""One optimiser step's gradients, in micro-batches, with log-probs only at completion positions.

`trainer.train_loop.Trainer` calls `accumulate_gradients` between `zero_grad` and the
optimiser step. The step's B sequences are cut into micro-batches of
`StepSettings.micro_batch` sequences; each one is forwarded, its loss backpropagated at
once (gradients add up in `.grad`), and its activations freed before the next one.

Inside a micro-batch of b sequences (L: its longest prompt + completion, T: its longest
completion, H: hidden size, V: vocabulary, n: its completion tokens, c: `logit_chunk`):

    hidden = body(ids)                      (b, L, H)  the transformer without its LM head
    rows   = hidden[i, p_i - 1 + t]         (n, H)     the state that predicts completion
                                                       token t of sequence i (prompt length p_i)
    for each chunk of c rows, under activation checkpointing:
        logits = head(rows) / τ_i           (c, V)     never kept: recomputed in backward
        logp   = log_softmax(logits)[token] (c,)
    logp scattered back to                  (b, T)     with the completion mask m

so no (b, L, V) or (b, T, V) tensor exists in forward or backward; at most one (c, V) chunk
(and its gradient) does.

The loss of a micro-batch is `trainer.loss.policy_loss` with the denominator of the whole
step (`total`), so the sum of the micro-batch losses, and of their gradients, is the loss of
one pass over all B sequences:

    token mean:    L = Σ_mb ( -Σ_{i∈mb,t} m_it o_it / N )     N = completion tokens in the step
    sequence mean: L = Σ_mb ( -Σ_{i∈mb} (Σ_t m_it o_it / n_i) / B )

With `kl_coef > 0`, log π_ref comes from `ref_model` (a frozen copy of the starting weights,
`frozen_copy`) through the same chunked path under `torch.no_grad`.

The forward pass is one module, `CompletionLogprobs` (packed micro-batch in, (b, T) log-probs
out), so that a data-parallel wrapper (`trainer.distributed`: DDP) sees every parameter's
use. On W ranks, rank r takes micro-batches r, r + W, r + 2W, ... of the step; DDP
averages the gradients over the ranks, so each rank's loss is multiplied by W and the
average is the step's sum. A rank left without a micro-batch forwards the step's first one
with its loss multiplied by 0 (DDP needs every rank in the gradient all-reduce). Only the
last micro-batch of a rank synchronises (`no_sync` before it).

Mixed precision (`StepSettings.autocast`, on by default on a CUDA device that has bf16):
the forward runs under `torch.autocast(dtype=bfloat16)`; the weights, their gradients and
AdamW's state stay float32 (the master), and the log-softmax of each chunk is float32.

Deliberately left out: sorting sequences by length to cut padding, and overlapping
micro-batches with anything else.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from trainer.loss import LossSettings, policy_loss
from trainer.samples import Sample

MICRO_BATCH = 8  # sequences per forward/backward
LOGIT_CHUNK = 1024  # completion rows per LM-head + log-softmax chunk


@dataclass(frozen=True)
class StepSettings:
    """How one optimiser step is cut up; local to a trainer (the run's math does not depend
    on it, so it is not part of the run manifest)."""

    micro_batch: int = MICRO_BATCH  # sequences per forward/backward pass
    logit_chunk: int = LOGIT_CHUNK  # completion rows per LM-head chunk
    # activation checkpointing of the transformer body; None: on for a CUDA model, off else
    grad_checkpointing: bool | None = None
    # bf16 autocast of the forward (fp32 master weights); None: on where the model's device
    # computes bf16 natively (a CUDA GPU that has it), off else (a CPU)
    autocast: bool | None = None

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {self.micro_batch}")
        if self.logit_chunk < 1:
            raise ValueError(f"logit_chunk must be >= 1, got {self.logit_chunk}")


@dataclass(frozen=True)
class Packed:
    """A micro-batch as tensors: right-padded ids and the (sequence, position) of each
    completion token's predicting row."""

    ids: torch.Tensor  # (b, L) right-padded prompt + completion
    attn: torch.Tensor  # (b, L) 1 on real tokens
    seq: torch.Tensor  # (n,) sequence of each completion token
    pos: torch.Tensor  # (n,) position of the row that predicts it (prompt length - 1 + t)
    slot: torch.Tensor  # (n,) its index t within the completion
    targets: torch.Tensor  # (n,) the completion token
    temps: torch.Tensor  # (n,) its sequence's sampling temperature (1 for greedy)
    mask: torch.Tensor  # (b, T) 1 for completion tokens


def pack(samples: Sequence[Sample], pad_id: int) -> Packed:
    """The tensors of one micro-batch (see `Packed`)."""
    seqs = [list(s.prompt_ids) + list(s.completion_ids) for s in samples]
    b, width = len(samples), max(len(s) for s in seqs)
    t_max = max(1, max(len(s.completion_ids) for s in samples))
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, t_max))
    seq, pos, slot, targets, temps = [], [], [], [], []
    for i, s in enumerate(samples):
        ids[i, : len(seqs[i])] = torch.tensor(seqs[i])
        attn[i, : len(seqs[i])] = 1
        n_p, n_c = len(s.prompt_ids), len(s.completion_ids)
        mask[i, :n_c] = 1.0
        seq += [i] * n_c
        pos += range(n_p - 1, n_p - 1 + n_c)
        slot += range(n_c)
        targets += s.completion_ids
        temps += [s.temperature if s.temperature > 0 else 1.0] * n_c
    return Packed(
        ids,
        attn,
        torch.tensor(seq, dtype=torch.long),
        torch.tensor(pos, dtype=torch.long),
        torch.tensor(slot, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        torch.tensor(temps, dtype=torch.float32),
        mask,
    )


def body_and_head(model: Any) -> tuple[Any, Any]:
    """(transformer body, LM head) of a Hugging Face causal LM (`model.model` and
    `model.lm_head`, else `get_decoder()` and `get_output_embeddings()`)."""
    body = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if body is None and hasattr(model, "get_decoder"):
        body = model.get_decoder()
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if body is None or head is None:
        raise TypeError(f"{type(model).__name__} has no transformer body and LM head to split")
    return body, head


def _chunk_logprobs(
    head: Any, rows: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor
) -> torch.Tensor:
    logits = head(rows).float() / temps[:, None]  # (c, V)
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)  # (c,)


def row_logprobs(
    head: Any, rows: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor, chunk: int
) -> torch.Tensor:
    """log softmax(head(rows) / temps)[targets], (n,), computed `chunk` rows at a time;
    with gradients on, each chunk is checkpointed so its (chunk, V) logits are recomputed
    in backward instead of kept."""
    parts = []
    for lo in range(0, rows.shape[0], chunk):
        args = (rows[lo : lo + chunk], targets[lo : lo + chunk], temps[lo : lo + chunk])
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_logprobs, head, *args, use_reentrant=False)
        else:
            part = _chunk_logprobs(head, *args)
        assert isinstance(part, torch.Tensor)
        parts.append(part)
    return torch.cat(parts) if parts else rows.new_zeros((0,), dtype=torch.float32)


def completion_token_logprobs(
    model: Any, samples: Sequence[Sample], pad_id: int, chunk: int = LOGIT_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (b, T), mask (b, T)) of each sample's completion tokens under `model` at
    its sampling temperature: one body pass, then the LM head on completion rows only."""
    return CompletionLogprobs(model, chunk)(pack(samples, pad_id))


class CompletionLogprobs(torch.nn.Module):
    """The policy as a training step forwards it: a packed micro-batch in, the (b, T)
    log-probs of its completion tokens and their mask out (module docstring). One module,
    so that DDP wraps the whole forward; `autocast` runs it under bf16 autocast."""

    def __init__(self, model: Any, chunk: int = LOGIT_CHUNK, autocast: bool = False) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk
        self.autocast = autocast

    def forward(self, p: Packed) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (b, T), mask (b, T)) of the micro-batch `p`."""
        body, head = body_and_head(self.model)
        dev = next(self.model.parameters()).device
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = body(input_ids=p.ids.to(dev), attention_mask=p.attn.to(dev), use_cache=False)
            hidden = out.last_hidden_state  # (b, L, H)
            seq, slot = p.seq.to(dev), p.slot.to(dev)
            rows = hidden[seq, p.pos.to(dev)]  # (n, H)
            logp_rows = row_logprobs(head, rows, p.targets.to(dev), p.temps.to(dev), self.chunk)
        logp = torch.zeros(p.mask.shape, dtype=logp_rows.dtype, device=dev)
        logp = logp.index_put((seq, slot), logp_rows)  # (b, T)
        return logp, p.mask.to(dev)


def autocast_wanted(settings: StepSettings, device: torch.device) -> bool:
    """Whether the step runs under bf16 autocast (`StepSettings.autocast`; None: on a CUDA
    device that computes bf16)."""
    if settings.autocast is not None:
        return settings.autocast
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def frozen_copy(model: Any) -> Any:
    """A copy of `model` in eval mode with no gradients: the KL term's π_ref."""
    ref = copy.deepcopy(model).eval()
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref


def use_body_checkpointing(model: Any, settings: StepSettings) -> None:
    """Turn on activation checkpointing of the body when `settings` asks for it (None: when
    the model is on CUDA) and the model supports it; Hugging Face applies it only while the
    model is in training mode."""
    wanted = settings.grad_checkpointing
    if wanted is None:
        wanted = next(model.parameters()).device.type == "cuda"
    if wanted and not getattr(model, "is_gradient_checkpointing", True):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def accumulate_gradients(
    model: Any,
    samples: Sequence[Sample],
    advantages: Sequence[float],
    pad_id: int,
    loss: LossSettings,
    settings: StepSettings,
    ref_model: Any = None,
    *,
    policy: Any = None,
    rank: int = 0,
    world: int = 1,
) -> tuple[float, dict[str, float]]:
    """Backpropagate one step's loss over `samples` micro-batch by micro-batch (the caller
    zeroes gradients before and steps the optimiser after); returns this rank's share of
    the step's loss and of its statistics, token-weighted over the micro-batches (module
    docstring has the math). `policy` is what is forwarded (default a `CompletionLogprobs`
    of `model`; a DDP wrapper of one on W = `world` ranks, this one `rank`)."""
    if loss.kl_coef > 0 and ref_model is None:
        raise ValueError("kl_coef > 0 needs a reference model (trainer.micro_step.frozen_copy)")
    use_body_checkpointing(model, settings)
    amp = autocast_wanted(settings, next(model.parameters()).device)
    if policy is None:
        policy = CompletionLogprobs(model, settings.logit_chunk, amp)
    ref = CompletionLogprobs(ref_model, settings.logit_chunk, amp) if loss.kl_coef > 0 else None
    n_tokens = sum(len(s.completion_ids) for s in samples)
    total = float(n_tokens if loss.aggregation == "token" else len(samples))
    value = 0.0
    stats: dict[str, float] = {
        "clip_fraction": 0.0,
        "is_weight_mean": 0.0,
        "is_truncated_fraction": 0.0,
        "kl": 0.0,
    }
    batches = [
        (lo, samples[lo : lo + settings.micro_batch])
        for lo in range(0, len(samples), settings.micro_batch)
        if any(s.completion_ids for s in samples[lo : lo + settings.micro_batch])
    ]
    mine = [(lo, mb, float(world)) for lo, mb in batches[rank::world]]
    if not mine and world > 1 and batches:  # nothing left for this rank: join with weight 0
        mine = [(*batches[0], 0.0)]
    for k, (lo, mb, scale) in enumerate(mine):
        adv = list(advantages[lo : lo + settings.micro_batch])
        last = k == len(mine) - 1
        sync = contextlib.nullcontext() if last or world == 1 else policy.no_sync()
        with sync:
            p = pack(mb, pad_id)
            logp, mask = policy(p)  # (b, T)
            sampler = torch.zeros(logp.shape)
            for i, s in enumerate(mb):
                recorded = s.sampler_logprobs[: logp.shape[1]]
                sampler[i, : len(recorded)] = torch.tensor(recorded)
            ref_logp = None
            if ref is not None:
                with torch.no_grad():
                    ref_logp, _ = ref(p)
            part, part_stats = policy_loss(
                logp,
                logp.detach(),  # π_old: one optimiser step per batch, so ρ = 1 at the step
                sampler.to(logp.device),
                torch.tensor(adv, device=logp.device),
                mask,
                loss,
                ref_logp=ref_logp,
                total=total,
            )
            (part * scale).backward()  # DDP divides the gradients by W: scale = W
        if scale == 0.0:
            continue
        value += float(part.detach())
        weight = float(mask.sum()) / n_tokens
        for key in ("clip_fraction", "is_weight_mean", "is_truncated_fraction"):
            stats[key] += weight * part_stats[key]
        stats["kl"] += part_stats["kl"]  # already divided by the step's total
    return value, stats
