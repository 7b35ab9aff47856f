"""GPU generation engine on vLLM, behind the same `Engine` interface as the CPU engine.

Imported only when used (`pip install swarm-node[gpu]`); nothing here runs at import time
without vLLM. Tested only where a CUDA GPU and vLLM exist (tests skip elsewhere).

How the protocol's sampling rule (`verify.sampling`) runs inside vLLM: a V1 logits
processor (`SeededGumbelProcessor`, the `LogitsProcessor` API of vLLM >= 0.10.2's V1
model runner; vLLM's newer "model runner V2" has a different interface) reads each
request's `extra_args["swarm_seed"]` and its live output-token list (step = tokens so
far), applies the rule on the GPU (same Philox noise via `gumbel_noise_torch`, same
top-k / top-p order and tie-breaks), and leaves only the chosen token finite; vLLM then
runs greedy, so it emits exactly that token.

Hidden states and log-probs: vLLM does not hand out final-norm hidden states, so after
generation one prefill of prompt + completion runs through a transformers copy of the
model on the same GPU (bf16), exactly as a verifier does; `hidden` and the sampler's
log-probs (rule step 5, on those logits) come from it. One prefill costs a small fraction
of the decode it follows. Memory: the weights are held twice (vLLM + transformers);
`gpu_memory_utilization` leaves room for the copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainer.engine import Engine, Generation, SamplingSettings, check_batch

SEED_KEY = "swarm_seed"
SETTINGS_KEY = "swarm_settings"  # (temperature, top_p, top_k)


def seeded_choice_torch(
    logits: torch.Tensor, *, temperature: float, top_p: float, top_k: int, seed: int, step: int
) -> int:
    """The rule of `verify.sampling` for one row, on the logits' device (GPU)."""
    from verify.sampling import gumbel_noise_torch

    x = logits.float()
    if temperature == 0.0:
        return int(torch.argmax(x))
    v = x.shape[-1]
    z = x / temperature
    order = torch.sort(-z, stable=True).indices  # descending, ties → lower id
    zs = z[order]
    keep = torch.ones(v, dtype=torch.bool, device=x.device)
    if 0 < top_k < v:
        keep[top_k:] = False
    if top_p < 1.0:
        zz = torch.where(
            keep, zs.double(), torch.tensor(float("-inf"), device=x.device, dtype=torch.float64)
        )
        p = torch.softmax(zz - zz[0], dim=-1)
        before = torch.cumsum(p, dim=-1) - p
        keep &= before < top_p
    keep &= zs > float("-inf")
    keep[0] = True
    mask = torch.zeros(v, dtype=torch.bool, device=x.device)
    mask[order] = keep
    g = gumbel_noise_torch([seed], [step], v, device=x.device)[0]
    scores = torch.where(mask, z + g, torch.tensor(float("-inf"), device=x.device))
    return int(torch.argmax(scores))


def recorded_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], settings: SamplingSettings, seed: int
) -> list[float]:
    """Rule step 5 for tokens already chosen: log-prob of each under the filtered, tempered
    distribution of its row of `logits` [T, V] (floored at -1e4; 0.0 when greedy)."""
    import numpy as np

    from verify.sampling import perturbed_scores

    t = len(tokens)
    if t == 0:
        return []
    if settings.temperature == 0.0:
        return [0.0] * t
    _, zk = perturbed_scores(
        logits,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        seeds=[seed] * t,
        steps=list(range(t)),
    )
    z = zk.astype(np.float64)
    zmax = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - zmax).sum(axis=1)) + zmax[:, 0]
    lp = z[np.arange(t), np.asarray(tokens)] - lse
    return np.maximum(lp, -1e4).astype(np.float32).tolist()


try:  # vLLM is optional: without it only the torch helpers above are usable
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
except ImportError:  # pragma: no cover - depends on the install
    LogitsProcessor = None

PROCESSOR_FQCN = "trainer.engine_vllm:SeededGumbelProcessor"  # importable in vLLM workers

if LogitsProcessor is not None:  # pragma: no cover - GPU installs only

    class SeededGumbelProcessor(LogitsProcessor):
        """Forces each opted-in request's next token to the seeded rule's choice."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[int, tuple[float, float, int], list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, out_ids in batch_update.added:
                extra = getattr(params, "extra_args", None) or {}
                if SEED_KEY in extra:
                    self.rows[index] = (int(extra[SEED_KEY]), tuple(extra[SETTINGS_KEY]), out_ids)
                else:
                    self.rows.pop(index, None)
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and direction.name == "SWAP":
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for index, (seed, (temp, top_p, top_k), out_ids) in self.rows.items():
                if index >= logits.shape[0]:
                    continue
                tok = seeded_choice_torch(
                    logits[index],
                    temperature=temp,
                    top_p=top_p,
                    top_k=top_k,
                    seed=seed,
                    step=len(out_ids),
                )
                logits[index].fill_(float("-inf"))
                logits[index, tok] = 0.0
            return logits


class VLLMEngine(Engine):
    """Generation on a GPU with vLLM; same contract as `HFEngine` (see `trainer.engine`)."""

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.6,
        max_model_len: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise RuntimeError(
                "the vLLM engine needs vLLM (pip install 'swarm-node[gpu]') and a CUDA GPU"
            ) from exc
        if not torch.cuda.is_available():
            raise RuntimeError("the vLLM engine needs a CUDA GPU; use the CPU engine instead")
        from trainer.model_dir import load_model_dir

        if LogitsProcessor is None:
            raise RuntimeError("this vLLM has no V1 LogitsProcessor API (needs vLLM >= 0.10.2)")
        self.llm = vllm.LLM(
            model=str(model_dir),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            logits_processors=[PROCESSOR_FQCN],
            enable_prefix_caching=False,
            **llm_kwargs,
        )
        self._vllm = vllm
        model, tok = load_model_dir(model_dir, dtype=torch.bfloat16)
        self.model = model.to("cuda").eval()
        self.tokenizer = tok
        head = self.model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0])
        self.hidden_size = int(head.weight.shape[1])
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = tok.eos_token_id
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos])

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        seeds: Sequence[int],
        capture_hidden: bool = True,
    ) -> list[Generation]:
        check_batch(prompts, seeds, self.vocab_size)
        sp = self._vllm.SamplingParams
        params = [
            sp(
                temperature=0.0,  # the processor leaves one finite logit: greedy takes it
                max_tokens=settings.max_new_tokens,
                stop_token_ids=sorted(self.eos_token_ids),
                skip_special_tokens=False,
                extra_args={
                    SEED_KEY: int(s),
                    SETTINGS_KEY: (settings.temperature, settings.top_p, settings.top_k),
                },
            )
            for s in seeds
        ]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        results = []
        for prompt, seed, out in zip(prompts, seeds, outs, strict=True):
            comp = list(out.outputs[0].token_ids)
            finish = "eos" if comp and comp[-1] in self.eos_token_ids else "length"
            ids = torch.tensor([list(prompt) + comp], device="cuda")
            with torch.inference_mode():
                h = self.model.base_model(input_ids=ids).last_hidden_state[0]
                h = h[len(prompt) - 1 : len(prompt) + len(comp) - 1]
                logits = self.model.get_output_embeddings()(h).float()
            logprobs = recorded_logprobs(logits.cpu(), comp, settings, int(seed))
            hidden = h.float().cpu() if capture_hidden else None
            results.append(Generation(comp, logprobs, hidden, finish))  # type: ignore[arg-type]
        return results

    def close(self) -> None:
        del self.llm
        torch.cuda.empty_cache()
