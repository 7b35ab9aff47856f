"""The built-in tiny policy: a tokenizer and a small Qwen2 model made here, warm-started.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with `tokenizers` on the
built-in task text (digits split one per token, `<answer>` and `</answer>` single tokens).
The model is a standard `transformers` Qwen2 (4 layers, hidden 128, 0.83M parameters), so
its directory is an ordinary Hugging Face model directory any engine can load.

Warm start (supervised): next-token cross-entropy on `prompt -> working <answer>gold</answer>
<eos>` over freshly generated tasks of the built-in mix, loss on the completion only, AdamW with
a linear warm-up and cosine decay. Every `EVAL_EVERY` steps the policy is scored on
`EVAL_TASKS` held-out tasks with the run's own seeded sampler (temperature 1.0); training
stops at the first evaluation reaching `TARGET_SOLVE_RATE` (or at `MAX_STEPS`), so RL starts
from a policy that solves a modest share of tasks (signal), not all of them (nothing left
to learn). The working (`worked_solution`) shows the intermediate steps before the answer:
running sums line by line for chain sums (`4 - 1 = 3`, `3 - 7 = -4`, ...), counted multiples
for products (`8 * 4: 1:4 2:8 ... 8:32`), so completions run ~30 tokens (proofs span chunks,
and RL has steps to shape). The reported solve rates come from `FINAL_EVAL_TASKS` fresh held-out tasks.
Training runs on one thread by default, so the result is deterministic for a seed (float
reductions can still differ across CPU types and library versions).

Cache: `<data dir>/models/tiny-<RECIPE>-seed<seed>/` (written to a temporary directory
then renamed), with `warm_start.json` holding the report. Data dir: `--data-dir`, else
`$SWARM_NODE_DATA`, else `~/.cache/swarm-node`.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer.engine import SamplingSettings
from trainer.model_dir import save_model_dir
from trainer.tasks import Task, TaskSet, render_prompt, render_target

# ----------------------------------------------------------------------------- settings
RECIPE = "v4"  # bump when anything below changes: it names the cache directory
BUILTIN_MODEL = "builtin:tiny"
TASK_MIX: tuple[tuple[str, int], ...] = (  # (tiny-gcd is left out: "1" solves ~60% of it)
    ("tiny-chain-sum-4", 2),  # 80,000 distinct problems: a rise is not memorisation
    ("tiny-products", 1),
)
VOCAB_SIZE = 512  # BPE target (special and added tokens included)
HIDDEN = 128
LAYERS = 4
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 384
MAX_POSITIONS = 256
TOKENIZER_TEXTS = 3000  # task texts the tokenizer is trained on

BATCH = 64  # warm-start sequences per step
LR = 5e-3  # peak; cosine decay to LR_FLOOR x LR at MAX_STEPS
LR_FLOOR = 0.1
WARMUP_STEPS = 20
WEIGHT_DECAY = 0.01
MAX_STEPS = 400
EVAL_EVERY = 25
EVAL_TASKS = 128  # per evaluation during training
FINAL_EVAL_TASKS = 256  # fresh held-out tasks for the reported solve rates
TARGET_SOLVE_RATE = 0.2  # stop at the first evaluation at or above this
EVAL_TEMPERATURE = 1.0
EVAL_MAX_NEW_TOKENS = 64
DEFAULT_MAX_NEW_TOKENS = 64  # for the built-in run manifest

PAD, EOS = "<|pad|>", "<|endoftext|>"  # Qwen2Tokenizer defaults unk to <|endoftext|>
ADDED = ("<answer>", "</answer>")
_TRAIN_SEED_TAG = 0x5EED_0000  # the warm start's task seeds never equal a run's


def default_data_dir(value: str | os.PathLike[str] | None = None) -> Path:
    """`value` if given, else $SWARM_NODE_DATA, else ~/.cache/swarm-node."""
    if value:
        return Path(value).expanduser()
    env = os.environ.get("SWARM_NODE_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "swarm-node"


def policy_dir(data_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> Path:
    """Where the built-in policy of `seed` is built under a data directory."""
    return default_data_dir(data_dir) / "models" / f"tiny-{RECIPE}-seed{seed}"


def is_built(path: Path) -> bool:
    """Whether `path` holds a finished built-in policy (its report and config written)."""
    return (path / "warm_start.json").is_file() and (path / "config.json").is_file()


# ---------------------------------------------------------------------------- working
def worked_solution(task: Task) -> str:
    """The completion the warm start teaches: intermediate steps, then the answer.

    Chain sums (`a op b op c ...`): one line per operation with the running value.
    Products (`a * b`): the multiples of b counted up to a (`k:k*b`). Anything else: the
    answer alone. The final value always equals the task's own answer."""
    expr = str(task.entry.get("metadata", {}).get("expression", ""))
    parts = expr.split()
    lines: list[str] = []
    if len(parts) >= 3 and len(parts) % 2 == 1 and set(parts[1::2]) <= {"+", "-"}:
        value = int(parts[0])
        for op, term in zip(parts[1::2], parts[2::2], strict=True):
            new = value + int(term) if op == "+" else value - int(term)
            lines.append(f"{value} {op} {term} = {new}")
            value = new
    elif len(parts) == 3 and parts[1] == "*":
        a, b = int(parts[0]), int(parts[2])
        steps = " ".join(f"{k}:{k * b}" for k in range(1, a + 1)) if a > 0 else "0"
        lines.append(f"{a} * {b}: {steps}")
    working = "".join(line + "\n" for line in lines)
    return working + render_target(task.answer or "")


# ---------------------------------------------------------------------------- tokenizer
def _task_texts(seed: int, n: int) -> list[str]:
    tasks = TaskSet(_TRAIN_SEED_TAG + seed + 1)
    out = []
    for i in range(n):
        name = TASK_MIX[i % len(TASK_MIX)][0]
        t = tasks.task(name, i)
        out.append(render_prompt(t.question) + worked_solution(t))
    return out


def build_tokenizer(seed: int = 0, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on the built-in task text."""
    from tokenizers import (  # deferred: heavy import
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # deferred: heavy import

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("<answer>", "isolated"),
            pre_tokenizers.Split("</answer>", "isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED),
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_task_texts(seed, TOKENIZER_TEXTS), trainer)
    tok.add_tokens(list(ADDED))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.padding_side = "left"
    return fast


# -------------------------------------------------------------------------------- model
def build_model(tokenizer: Any, seed: int = 0, **overrides: Any) -> Any:
    """A freshly initialised Qwen2 causal LM sized for the tokenizer (float32, CPU)."""
    import torch  # deferred: heavy import
    from transformers import Qwen2Config, Qwen2ForCausalLM  # deferred: heavy import

    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    kw.update(overrides)
    config = Qwen2Config(**kw)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


# ----------------------------------------------------------------------------- training
@dataclass
class WarmStartReport:
    """What the warm start did and how well the result solves held-out tasks (written as
    `warm_start.json`)."""

    recipe: str
    seed: int
    steps: int
    seconds: float
    solve_rate: float  # sampled at EVAL_TEMPERATURE on FINAL_EVAL_TASKS fresh held-out tasks
    greedy_solve_rate: float
    target_solve_rate: float
    evals: list[tuple[int, float]]
    final_loss: float
    threads: int
    n_params: int
    vocab_size: int


def _encode_example(tokenizer: Any, prompt: str, target: str) -> tuple[list[int], list[int]]:
    p = tokenizer.encode(prompt, add_special_tokens=False)
    c = tokenizer.encode(target, add_special_tokens=False) + [tokenizer.eos_token_id]
    return p, c


def solve_rate(
    engine: Any,
    tokenizer: Any,
    tasks: TaskSet,
    items: list[tuple[str, int]],
    temperature: float,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    seed: int = 0,
) -> float:
    """Share of `items` (dataset, index) whose completion scores 1.0."""
    batch = [tasks.task(n, i) for n, i in items]
    prompts = [tokenizer.encode(t.prompt, add_special_tokens=False) for t in batch]
    settings = SamplingSettings(temperature=temperature, max_new_tokens=max_new_tokens)
    seeds = [(seed * 1_000_003 + k) % 2**64 for k in range(len(batch))]
    gens = engine.generate(prompts, settings, seeds, capture_hidden=False)
    solved = 0
    for t, g in zip(batch, gens, strict=True):
        text = tokenizer.decode(g.completion_ids, skip_special_tokens=True)
        solved += tasks.score(t, text).reward >= 1.0
    return solved / len(batch)


def _batch(
    tokenizer: Any, tasks: TaskSet, names: list[str], gen: Any, step: int
) -> tuple[Any, Any]:
    """One batch of fresh tasks, right-padded: `ids` (B, T) and `labels` (B, T), the labels
    -100 (ignored) everywhere but on the completion."""
    import torch  # deferred: heavy import

    picks = torch.randint(0, len(names), (BATCH,), generator=gen).tolist()
    seqs, starts = [], []
    for k, pick in enumerate(picks):
        t = tasks.task(names[pick], step * BATCH + k)
        p, c = _encode_example(tokenizer, t.prompt, worked_solution(t))
        seqs.append(p + c)
        starts.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((BATCH, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((BATCH, width), -100, dtype=torch.long)
    for k, s in enumerate(seqs):
        ids[k, : len(s)] = torch.tensor(s)
        labels[k, starts[k] : len(s)] = torch.tensor(s[starts[k] :])
    return ids, labels


def _lr(step: int, max_steps: int) -> float:
    """Linear warm-up over `WARMUP_STEPS`, then cosine decay from LR to LR_FLOOR x LR at
    `max_steps`."""
    decay = 0.5 * (1 + math.cos(math.pi * min(1.0, step / max_steps)))
    return LR * min(1.0, (step + 1) / WARMUP_STEPS) * (LR_FLOOR + (1 - LR_FLOOR) * decay)


def _loss(model: Any, ids: Any, labels: Any) -> Any:
    """Next-token cross-entropy: position t predicts token t+1, scored where labelled."""
    import torch  # deferred: heavy import

    dev = next(model.parameters()).device
    logits = model(input_ids=ids.to(dev)).logits  # (B, T, V)
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1).to(dev),
        ignore_index=-100,
    )


def _final_eval(
    model: Any, tokenizer: Any, tasks: TaskSet, names: list[str], seed: int
) -> tuple[float, float]:
    """Sampled and greedy solve rates on `FINAL_EVAL_TASKS` fresh held-out tasks."""
    from trainer.engine_hf import HFEngine  # deferred: heavy import

    model.eval()
    items = [(names[k % len(names)], EVAL_TASKS + k) for k in range(FINAL_EVAL_TASKS)]
    engine = HFEngine(model, tokenizer, max_batch=FINAL_EVAL_TASKS)
    rate = solve_rate(engine, tokenizer, tasks, items, EVAL_TEMPERATURE, seed=seed + 1)
    greedy = solve_rate(engine, tokenizer, tasks, items, 0.0, seed=seed)
    return rate, greedy


def warm_start(
    model: Any,
    tokenizer: Any,
    *,
    seed: int = 0,
    max_steps: int | None = None,
    target: float | None = None,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> WarmStartReport:
    """Supervised warm start in place (see module docstring); returns the report."""
    import torch  # deferred: heavy import

    from trainer.engine_hf import HFEngine, torch_threads  # deferred: heavy import

    say = progress or (lambda _m: None)
    max_steps = MAX_STEPS if max_steps is None else max_steps
    target = TARGET_SOLVE_RATE if target is None else target
    t0 = time.perf_counter()
    train_tasks = TaskSet(_TRAIN_SEED_TAG + seed + 2)
    eval_tasks = TaskSet(_TRAIN_SEED_TAG + seed + 3)
    names = [n for n, w in TASK_MIX for _ in range(w)]
    eval_items = [(names[k % len(names)], k) for k in range(EVAL_TASKS)]
    engine = HFEngine(model, tokenizer, max_batch=EVAL_TASKS)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95))
    evals: list[tuple[int, float]] = []
    loss_value = float("nan")
    step = 0
    # One thread by default: for a model this small, threads add overhead, and one thread
    # makes the result the same on machines with different core counts.
    with torch_threads(1 if threads is None else threads):
        n_threads = torch.get_num_threads()
        while step < max_steps:
            ids, labels = _batch(tokenizer, train_tasks, names, gen, step)
            model.train()
            for g in opt.param_groups:
                g["lr"] = _lr(step, max_steps)
            loss = _loss(model, ids, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_value = loss.item()
            step += 1
            if step % EVAL_EVERY == 0 or step == max_steps:
                model.eval()
                rate = solve_rate(
                    engine, tokenizer, eval_tasks, eval_items, EVAL_TEMPERATURE, seed=seed
                )
                evals.append((step, rate))
                say(
                    f"warm start: step {step}/{max_steps} loss {loss_value:.3f} "
                    f"solve rate {rate:.1%} ({time.perf_counter() - t0:.0f}s)"
                )
                if rate >= target:
                    break
        rate, greedy = _final_eval(model, tokenizer, eval_tasks, names, seed)
        say(
            f"warm start: done after {step} steps; solve rate {rate:.1%} sampled, {greedy:.1%} greedy"
        )
    return WarmStartReport(
        recipe=RECIPE,
        seed=seed,
        steps=step,
        seconds=round(time.perf_counter() - t0, 2),
        solve_rate=rate,
        greedy_solve_rate=greedy,
        target_solve_rate=target,
        evals=evals,
        final_loss=round(loss_value, 4),
        threads=n_threads,
        n_params=sum(p.numel() for p in model.parameters()),
        vocab_size=len(tokenizer),
    )


# -------------------------------------------------------------------------------- cache
def ensure_policy(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    force: bool = False,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, dict[str, Any], bool]:
    """(model directory, warm-start report, built_now). Builds it if not cached."""
    say = progress or (lambda _m: None)
    out = policy_dir(data_dir, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; others then find the cache
        if is_built(out) and not force:
            return out, json.loads((out / "warm_start.json").read_text()), False
        t0 = time.perf_counter()
        say("building tokenizer")
        tok = build_tokenizer(seed)
        model = build_model(tok, seed)
        say(
            f"model: Qwen2, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
            f"vocab {len(tok)}"
        )
        report = asdict(warm_start(model, tok, seed=seed, threads=threads, progress=say))
        report["init_model_seconds"] = round(time.perf_counter() - t0, 2)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model_dir(model, tok, tmp)
        (tmp / "warm_start.json").write_text(json.dumps(report, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return out, report, True


RL_LR = 5e-5  # the built-in run's learning rate (see run_manifest_table)


def run_manifest_table(run_id: str = "tiny-local", seed: int = 1) -> dict[str, Any]:
    """A run manifest (as a TOML table for `node.run_file.manifest_from_table`) for the
    built-in policy and task mix."""
    # A staleness bound of 3 versions: an unaudited rollout waits the standing rule's hold
    # (`protocol.standing.HOLD_S`) before it trains, longer than a version takes here, and
    # a paced worker (`--rollouts-per-version`) runs S - 1 versions ahead.
    return {
        "run": {
            "id": run_id,
            "model": BUILTIN_MODEL,
            "seed": seed,
            "group_size": 4,
            "max_staleness": 3,
        },
        "sampling": {
            "max_new_tokens": DEFAULT_MAX_NEW_TOKENS,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
        },
        "proofs": {"chunk": 32, "topk": 128},
        # Few rollouts reach a devnet's trainer (a few per second): small steps, a small
        # learning rate (larger ones made this policy worse). A version every few steps, so
        # that versions do not outrun the audits and the hold within the staleness bound.
        # Steps of 16 groups: groups whose rewards are all equal carry no gradient, and at
        # this solve rate a small step learns from a few groups only, so its direction is
        # mostly noise that later steps undo. docs/BENCHMARKS.md has the devnet runs these
        # settings were chosen by.
        "rl": {"lr": RL_LR, "groups_per_step": 16, "publish_every": 32},
        "datasets": [{"name": n, "weight": w} for n, w in TASK_MIX],
    }
