"""`bench scale`'s `gen` part: the worker's rollouts against plain transformers `generate`.

In one process, on the same model, prompts and batch:

- plain: `model.generate` (sampling at the run's temperature, no top-k/top-p, KV cache) on
  the first batch of prompts; `plain_hf_tokens_per_s` is its new tokens over its time.
- ours: `trainer.produce.generate_records` (what `swarm-node rollouts` and the inference
  role run: the seeded sampler with recorded log-probs, hidden rows captured, activation
  proofs built, records signed and written) over all the rollouts at the same batch;
  `gen_tokens_per_s` is its completion tokens over its wall time, proofs included.
- `gen_over_plain_hf`: ours ÷ plain.
- `capture_overhead`: (the proofs' build time + the hidden-row capture's extra time) ÷
  the engine's decode time. The proofs are timed where they are built (the builder is
  wrapped); the capture's extra time is the first batch generated again with capture off
  (`capture_pair`, full mode only: at `--quick` it would double the part's time, so the
  figure there counts the proofs only and `capture_overhead_parts` says so).

The records go to `config["records"]` for the audit and train parts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from node.console import sayer
from swarm_node_bench.parts.scale_model import (
    bench_manifest,
    child_setup,
    gpu_gib,
    load_timed,
    peak_rss_gib,
    sync,
)


def _prompts(tok: Any, manifest: Any, producer: bytes, n: int) -> tuple[list[list[int]], list[int]]:
    from trainer.tasks import TaskSet, assign_task  # deferred: heavy import

    tasks = TaskSet(manifest.seed)
    assigns = [assign_task(manifest, producer, c) for c in range(n)]
    prompts = [tok.encode(tasks.task_for(a).prompt, add_special_tokens=False) for a in assigns]
    return prompts, [a.task_seed for a in assigns]


def plain_generate(
    model: Any, tok: Any, prompts: list[list[int]], settings: Any, device: str
) -> tuple[float, int]:
    """(seconds, new tokens) of one plain transformers `generate` call on `prompts`
    (left-padded), sampling at the settings' temperature, stopping at EOS."""
    import torch  # deferred: heavy import

    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=settings.temperature > 0,
            temperature=settings.temperature if settings.temperature > 0 else None,
            top_k=None,
            top_p=None,
            max_new_tokens=settings.max_new_tokens,
            pad_token_id=pad,
        )
        sync(device)
        dt = time.perf_counter() - t0
    new = 0
    for row in out[:, width:].tolist():
        for t in row:
            new += 1
            if t in eos_ids:
                break
    return dt, new


class _TimedBuilder:
    """A proof builder that adds up the seconds spent building (`build_proofs_bytes_many`)."""

    def __init__(self, build: Any) -> None:
        self.build = build
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.build(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def gen_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part (module docstring); `config`: model_dir, tokens, rollouts, batch, device,
    records (output file), capture_pair."""
    from protocol.identity import Identity  # deferred: heavy import
    from trainer.engine import SamplingSettings  # deferred: heavy import
    from trainer.engine_hf import HFEngine  # deferred: heavy import
    from trainer.produce import generate_records  # deferred: heavy import
    from verify.toploc import build_proofs_bytes_many  # deferred: heavy import

    say = sayer("bench scale gen")
    device = child_setup(config)
    model, tok, loaded = load_timed(config, device)
    manifest = bench_manifest(config["model_dir"], config["tokens"], config.get("lr", 1e-6))
    settings = SamplingSettings.from_manifest(manifest)
    identity = Identity.from_private_bytes(bytes(31) + b"\x01")
    n, batch = int(config["rollouts"]), int(config["batch"])
    engine = HFEngine(model, tok, max_batch=batch)
    prompts, seeds = _prompts(tok, manifest, identity.peer_id, batch)

    warm = SamplingSettings(max_new_tokens=2)
    engine.generate([prompts[0][:8]], warm, [seeds[0]])  # warm-up, both paths
    plain_generate(model, tok, [prompts[0][:8]], warm, device)
    say(f"plain transformers generate: {batch} x {settings.max_new_tokens} tokens")
    plain_s, plain_tokens = plain_generate(model, tok, prompts, settings, device)
    say(f"plain: {plain_tokens / plain_s:.2f} tokens/s; now ours, {n} rollouts")
    plain_tps = plain_tokens / plain_s

    builder = _TimedBuilder(build_proofs_bytes_many)
    t0 = time.perf_counter()
    summary = generate_records(
        engine=engine,
        manifest=manifest,
        identity=identity,
        n=n,
        out=Path(config["records"]),
        batch_size=batch,
        build_proofs=builder,
        say=say,
    )
    sync(device)
    ours_s = time.perf_counter() - t0
    ours_tps = summary["tokens"] / ours_s
    decode_s = summary["tokens"] / summary["tokens_per_s"]  # the engine's generate calls
    capture: dict[str, Any] = {
        "proofs_s": round(builder.seconds, 3),
        "decode_s": round(decode_s, 2),
    }
    extra = 0.0
    if config.get("capture_pair"):
        t_cap = time.perf_counter()
        engine.generate(prompts, settings, seeds, capture_hidden=True)
        t_cap = time.perf_counter() - t_cap
        t_no = time.perf_counter()
        engine.generate(prompts, settings, seeds, capture_hidden=False)
        t_no = time.perf_counter() - t_no
        extra = max(0.0, t_cap - t_no) * (decode_s / max(t_no, 1e-9))
        capture["hidden_rows_s"] = round(extra, 3)
    else:
        capture["hidden_rows_s"] = None
        capture["note"] = "--quick: proofs only; the hidden-row copies are not separated"
    return {
        "worker": loaded,
        "gen_tokens_per_s": round(ours_tps, 2),
        "plain_hf_tokens_per_s": round(plain_tps, 2),
        "gen_over_plain_hf": round(ours_tps / plain_tps, 3),
        "capture_overhead": round((builder.seconds + extra) / decode_s, 4),
        "capture_overhead_parts": capture,
        "gen_s_per_rollout": round(ours_s / n, 3),
        "gen_batch": batch,
        "rollouts": summary["n"],
        "completion_tokens": summary["tokens"],
        "finish": summary["finish"],
        "gen_peak_gib": peak_rss_gib(),
        "gen_gpu_gib": gpu_gib(device),
    }
