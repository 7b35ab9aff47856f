"""CPU generation engine on `transformers`: batched, KV-cached, seeded sampling.

Works with any causal LM directory on disk (`trainer.model_dir`). Prompts of a batch are
left-padded; explicit position ids start at 0 for every sample, so a sample's logits do
not depend on which batch it ran in (up to float rounding). Finished samples are dropped
from the batch (and from the KV cache) as soon as they end.

Hidden states: for architectures whose logits are `lm_head(final_norm(h))` (Llama, Qwen2,
Qwen3, Mistral, ...) the engine runs the base model, keeps its `last_hidden_state` (after
the final norm) and applies the LM head itself, so capture costs one row copy per token.
Other architectures run the full model with `output_hidden_states=True` and take the last
entry (transformers' convention: after the final norm).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from trainer.engine import Engine, FinishReason, Generation, SamplingSettings, check_batch
from verify.sampling import sample_tokens, sample_tokens_torch

SMALL_MODEL_PARAMS = 20_000_000  # below this the engine defaults to one thread

# Architectures whose logits are exactly lm_head(base_model(...).last_hidden_state).
_PLAIN_HEAD = {
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Olmo2ForCausalLM",
    "SmolLM3ForCausalLM",
}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with `n` intra-op threads (None: leave as is)."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


class HFEngine(Engine):
    """Generation with a transformers model on the CPU.

    `sampler="seeded"` (the protocol's Gumbel-max rule) or `"multinomial"` (torch's own
    sampler, unverifiable; only for measuring the seeded sampler's overhead).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 64,
        threads: int | None = None,
        sampler: str = "seeded",
    ) -> None:
        if sampler not in ("seeded", "multinomial"):
            raise ValueError(f"unknown sampler {sampler!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = int(max_batch)
        n_params = sum(p.numel() for p in model.parameters())
        if threads is None and n_params < SMALL_MODEL_PARAMS:
            threads = 1  # tiny matmuls: threading overhead (and oversubscription) dominate
        self.threads = threads
        self.sampler = sampler
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0])
        self.hidden_size = int(head.weight.shape[1])
        eos = model.generation_config.eos_token_id if model.generation_config else None
        if eos is None:
            eos = model.config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        eos_list = eos if isinstance(eos, list | tuple) else ([] if eos is None else [eos])
        self.eos_token_ids = frozenset(int(e) for e in eos_list)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(self.eos_token_ids) if eos_list else 0))
        self._plain = type(model).__name__ in _PLAIN_HEAD
        # transformers 5 renamed `past_key_values` to `cache`; the cache is updated in place.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._dtype = next(model.parameters()).dtype
        self._device = next(model.parameters()).device  # inputs go where the weights are

    # ------------------------------------------------------------------ forward
    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Last-position (logits float32 [B, V], hidden [B, H], cache)."""
        if self._plain:
            out = self.model.base_model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            h = out.last_hidden_state[:, -1, :]
            logits = self.model.get_output_embeddings()(h)
            return logits.float(), h, cache
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            output_hidden_states=True,
            **self._keep_kw,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :].float(), out.hidden_states[-1][:, -1, :], cache

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        seeds: Sequence[int],
        capture_hidden: bool = True,
    ) -> list[Generation]:
        """Generate one completion per prompt with transformers; `seeds[i]` seeds sample i."""
        check_batch(prompts, seeds, self.vocab_size)
        results: list[Generation] = []
        with torch_threads(self.threads), torch.inference_mode():
            for start in range(0, len(prompts), self.max_batch):
                results.extend(
                    self._generate_batch(
                        prompts[start : start + self.max_batch],
                        settings,
                        list(seeds[start : start + self.max_batch]),
                        capture_hidden,
                    )
                )
        return results

    def _sample(
        self, logits: torch.Tensor, settings: SamplingSettings, seeds: list[int], step: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.sampler == "seeded":
            # on an accelerator the rule runs where the logits are: only tokens and
            # log-probs leave it (the CPU takes the numpy rule, same values)
            rule = sample_tokens if logits.device.type == "cpu" else sample_tokens_torch
            return rule(
                logits,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                seeds=seeds,
                steps=step,
            )
        # Baseline: torch's multinomial on the tempered softmax (no filtering, unseeded).
        if settings.temperature == 0.0:
            tok = logits.argmax(-1)
            return tok.cpu().numpy(), np.zeros(len(seeds), dtype=np.float32)
        logp = torch.log_softmax(logits / settings.temperature, dim=-1)
        tok = torch.multinomial(logp.exp(), 1)[:, 0]
        return tok.cpu().numpy(), logp.gather(1, tok[:, None])[:, 0].cpu().numpy()

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        seeds: list[int],
        capture_hidden: bool,
    ) -> list[Generation]:
        from transformers import DynamicCache  # deferred: heavy import

        b = len(prompts)
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self._device
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)

        tokens: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        # per step: the batch's hidden rows [alive, H] and which sample each row is
        step_hidden: list[tuple[torch.Tensor, list[int]]] = []
        finish: list[FinishReason] = ["length"] * b
        alive = list(range(b))  # original indices of the rows still in the batch
        next_pos = torch.tensor(lengths, dtype=torch.long)

        cache = DynamicCache()
        logits, h, cache = self._forward(ids, mask, pos, cache)
        for step in range(settings.max_new_tokens):
            tok, lp = self._sample(logits, settings, [seeds[i] for i in alive], step)
            if capture_hidden:
                step_hidden.append((h.detach().to(torch.float32), list(alive)))
            keep_rows: list[int] = []
            for row, i in enumerate(alive):
                t = int(tok[row])
                tokens[i].append(t)
                logps[i].append(float(lp[row]))
                if t in self.eos_token_ids:
                    finish[i] = "eos"
                else:
                    keep_rows.append(row)
            if step + 1 == settings.max_new_tokens or not keep_rows:
                break
            if len(keep_rows) < len(alive):
                sel = torch.tensor(keep_rows, dtype=torch.long, device=dev)
                cache = _select_rows(cache, sel)
                mask = mask[sel]
                alive = [alive[r] for r in keep_rows]
                tok = tok[keep_rows]
            new_ids = torch.as_tensor(np.asarray(tok, dtype=np.int64)).view(-1, 1).to(dev)
            mask = torch.cat(
                [mask, torch.ones((len(alive), 1), dtype=torch.long, device=dev)], dim=1
            )
            step_pos = next_pos[alive].view(-1, 1).to(dev)
            next_pos[alive] += 1
            logits, h, cache = self._forward(new_ids, mask, step_pos, cache)

        hidden = _per_sample(step_hidden, b) if capture_hidden else [None] * b
        return [Generation(tokens[i], logps[i], hidden[i], finish[i]) for i in range(b)]


def _per_sample(step_hidden: list[tuple[torch.Tensor, list[int]]], b: int) -> list[torch.Tensor]:
    """Each sample's hidden rows [its steps, H], in step order, from the per-step batches
    (rows [alive, H] and which sample each row is): one gather for the whole batch, where
    a row at a time cost ~1% of generation."""
    h = torch.cat([hs for hs, _ in step_hidden]).to("cpu")  # `Generation.hidden` is on the CPU
    owner = torch.tensor([i for _, who in step_hidden for i in who], dtype=torch.long)
    counts = torch.bincount(owner, minlength=b).tolist()
    return list(torch.split(h[torch.argsort(owner, stable=True)], counts))


def _select_rows(cache: Any, sel: torch.Tensor) -> Any:
    """Keep only rows `sel` of a DynamicCache (in place where supported)."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(sel)
        return cache
    for layer in getattr(cache, "layers", []):  # transformers 5 layout
        layer.keys = layer.keys[sel]
        layer.values = layer.values[sel]
    return cache
