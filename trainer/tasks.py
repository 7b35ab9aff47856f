"""Tasks and rewards: a thin, deterministic adapter over `reasoning-gym`.

What this module owns:
- Which datasets a run may name (plain reasoning-gym names, or the built-in presets below
  that pin a small configuration), and which it refuses (gameable scorers).
- Task assignment: the task of rollout `counter` is a pure function of (run seed, producer
  peer id, counter), so a worker cannot choose easy tasks and any peer can re-derive it
  (`assign_task`). The policy version is not an input: a worker that samples one counter
  under several versions samples the same task, and may publish only one of them.
- The prompt template and answer extraction (the last `<answer>...</answer>`).
- Safe scoring: a scorer that raises, returns NaN or leaves [0, 1] gives a defined reward;
  partial credit is recorded (`PartialCreditLog`).

Assignment, step by step (all integers big-endian, hashes are `protocol.content_id`):
1. group = counter // group_size (the members of a GRPO group share one task).
2. h = content_id(b"swarm-node/task/v1" | u64 run_seed | u64 group | producer). Dataset: u64(h[0:8]) mod total_weight, walked over the manifest's datasets
   in order. Task index: u64(h[8:16]) mod that dataset's task space.
3. task_seed = u64(content_id(b"swarm-node/sample/v1" | u64 run_seed | u64 counter |
   producer)[0:8]): unique per rollout, the sampler's seed (`protocol.assignment`).
4. The reasoning-gym dataset is created with seed = u32(content_id(b"swarm-node/dataset/v1"
   | u64 run_seed | name)[0:4]); its item `task_index` is the task.
This module never does IO beyond what reasoning-gym does when it builds a dataset.
"""

from __future__ import annotations

import math
import re
import struct
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.assignment import task_seed
from protocol.content_id import content_id

PROMPT_TEMPLATE = "{question}\nReply with the final answer in <answer></answer>.\n"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_ANSWER_CHARS = 4096  # longer answers are not passed to scorers (some are quadratic)
DEFAULT_TASK_SPACE = 100_000


class TaskError(ValueError):
    """A dataset name or setting that cannot be used; the message is one line."""


# Datasets a manifest may not name, and why. A scorer that pays a constant answer at or
# above 0.5 on average turns RL into learning the constant (measured on 64 items each
# with answers such as "", "0", "1", "True", "False", "yes").
REFUSED_TASKS: dict[str, str] = {
    "game_of_life_halting": "its scorer gives 1.0 to any non-empty answer",
    "coin_flip": "the constant answer '0' scores about 0.95 on average",
    "isomorphic_strings": "the constant answer 'True' scores about 0.66 on average",
    "ransom_note": "the constant answer 'False' scores about 0.58 on average",
    "circuit_logic": "the constant answer '0' scores about 0.52 on average",
    "course_schedule": "the constant answer 'True' scores about 0.5 on average",
    "composite": "it needs nested dataset configuration a manifest cannot carry",
}

# Scorers known to give partial credit, and the form it takes (measured with near-miss
# and padded answers). Rewards in (0, 1) from any scorer are also counted at run time.
KNOWN_PARTIAL_CREDIT: dict[str, str] = {
    "chain_sum": "len(oracle)/len(answer) when the oracle is a substring of the answer",
    "basic_arithmetic": "len(oracle)/len(answer) when the oracle is a substring",
    "products": "len(oracle)/len(answer) when the oracle is a substring",
    "gcd": "len(oracle)/len(answer) when the oracle is a substring",
    "lcm": "len(oracle)/len(answer) when the oracle is a substring",
    "advanced_geometry": "0.01-0.05 for a well-formed wrong answer",
    "calendar_arithmetic": "small credit for near dates",
    "complex_arithmetic": "credit decaying with distance",
    "countdown": "0.01-0.05 for a well-formed wrong answer",
    "fraction_simplification": "0.01 for a well-formed wrong answer",
    "power_function": "0.01 for a well-formed wrong answer",
    "puzzle24": "0.01 for a well-formed wrong answer",
    "polynomial_equations": "credit by closeness of roots",
    "spell_backward": "credit by similarity",
    "arc_1d": "credit by similarity",
}


@dataclass(frozen=True)
class TaskSource:
    """A dataset as a run names it: reasoning-gym name, pinned config, task space."""

    name: str
    rg_name: str
    config: tuple[tuple[str, Any], ...] = ()
    task_space: int = DEFAULT_TASK_SPACE


# Presets: small configurations a tiny model can learn; the table is part of the protocol
# (every peer resolves the same name to the same generator).
PRESETS: dict[str, TaskSource] = {
    s.name: s
    for s in (
        TaskSource(
            "tiny-chain-sum",
            "chain_sum",
            (("min_terms", 2), ("max_terms", 2), ("min_digits", 1), ("max_digits", 1)),
        ),
        TaskSource(
            "tiny-chain-sum-4",
            "chain_sum",
            (("min_terms", 4), ("max_terms", 4), ("min_digits", 1), ("max_digits", 1)),
        ),
        TaskSource(
            "tiny-products",
            "products",
            (("min_terms", 2), ("max_terms", 2), ("min_digits", 1), ("max_digits", 1)),
        ),
        TaskSource(
            "tiny-gcd",
            "gcd",
            (("min_numbers", 2), ("max_numbers", 2), ("min_value", 1), ("max_value", 20)),
        ),
    )
}
_SMALL_SPACES = {"acre": 1_000, "word_ladder": 1_000}


def _rg_names() -> frozenset[str]:
    from reasoning_gym.factory import DATASETS  # deferred: heavy import

    return frozenset(DATASETS)


def resolve_dataset(name: str) -> TaskSource:
    """The `TaskSource` for a manifest's dataset name, or `TaskError` (one line)."""
    if name in PRESETS:
        return PRESETS[name]
    if name in REFUSED_TASKS:
        raise TaskError(f"dataset {name!r} is refused: {REFUSED_TASKS[name]}")
    if name not in _rg_names():
        presets = ", ".join(sorted(PRESETS))
        raise TaskError(
            f"unknown dataset {name!r} (not a reasoning-gym dataset nor a preset: {presets})"
        )
    return TaskSource(name, name, (), _SMALL_SPACES.get(name, DEFAULT_TASK_SPACE))


# ---------------------------------------------------------------------------- assignment


@dataclass(frozen=True)
class Assignment:
    """The task of one rollout, re-derivable by any peer."""

    dataset: str
    task_index: int
    counter: int
    task_seed: int  # also the sampling seed of the rollout
    group: int


def _u64(b: bytes) -> int:
    return int.from_bytes(b[:8], "big")


def derive_task(
    *,
    run_seed: int,
    datasets: Sequence[tuple[str, int]],
    group_size: int,
    producer: bytes,
    counter: int,
) -> Assignment:
    """Pure assignment rule (module docstring, steps 1-3). `datasets`: (name, weight)."""
    if not datasets:
        raise TaskError("a run needs at least one dataset")
    if group_size < 1:
        raise TaskError(f"group_size must be >= 1, got {group_size}")
    if counter < 0 or run_seed < 0:
        raise TaskError("run seed and counter must be non-negative")
    group = counter // group_size
    h = content_id(b"swarm-node/task/v1" + struct.pack(">QQ", run_seed, group) + bytes(producer))
    total = sum(w for _, w in datasets)
    if total <= 0 or any(w <= 0 for _, w in datasets):
        raise TaskError("dataset weights must be positive integers")
    pick = _u64(h[0:8]) % total
    name = datasets[-1][0]
    for candidate, weight in datasets:
        if pick < weight:
            name = candidate
            break
        pick -= weight
    source = resolve_dataset(name)
    task_index = _u64(h[8:16]) % source.task_space
    seed = task_seed(run_seed, counter, producer)
    return Assignment(name, task_index, counter, seed, group)


def assign_task(manifest: Any, producer: bytes, counter: int) -> Assignment:
    """`derive_task` with the run's seed, datasets and group size from a `RunManifest`."""
    return derive_task(
        run_seed=manifest.seed,
        datasets=[(d.name, d.weight) for d in manifest.datasets],
        group_size=manifest.group_size,
        producer=producer,
        counter=counter,
    )


def dataset_seed(run_seed: int, name: str) -> int:
    """The reasoning-gym seed of dataset `name` in a run (step 4)."""
    h = content_id(b"swarm-node/dataset/v1" + struct.pack(">Q", run_seed) + name.encode())
    return int.from_bytes(h[:4], "big")


# ------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """One task of a dataset: its question, reference answer and the dataset's raw entry."""

    dataset: str
    task_index: int
    question: str
    answer: str | None
    entry: dict[str, Any] = field(repr=False, compare=False)

    @property
    def prompt(self) -> str:
        """The prompt text the policy sees for this task."""
        return render_prompt(self.question)


def render_prompt(question: str) -> str:
    """The prompt text the policy sees for a task question."""
    return PROMPT_TEMPLATE.format(question=question.strip())


def render_target(answer: str) -> str:
    """The completion a perfect policy writes (used for the warm start)."""
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


class TaskSet:
    """The datasets of one run seed, built lazily and cached; thread-safe."""

    def __init__(self, run_seed: int) -> None:
        self.run_seed = run_seed
        self._datasets: dict[str, Any] = {}
        self._lock = threading.Lock()

    def dataset(self, name: str) -> Any:
        """The dataset `name`, built once and cached (thread-safe)."""
        with self._lock:
            ds = self._datasets.get(name)
            if ds is None:
                ds = self._build(name)
                self._datasets[name] = ds
            return ds

    def _build(self, name: str) -> Any:
        import reasoning_gym  # deferred: heavy import

        source = resolve_dataset(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return reasoning_gym.create_dataset(
                    source.rg_name,
                    seed=dataset_seed(self.run_seed, name),
                    size=source.task_space,
                    **dict(source.config),
                )
        except Exception as exc:  # reasoning-gym raises assorted types on bad configs
            raise TaskError(
                f"dataset {name!r} cannot be built: {type(exc).__name__}: {exc}"
            ) from None

    def task(self, name: str, task_index: int) -> Task:
        """Task `task_index` of dataset `name`."""
        ds = self.dataset(name)
        try:
            entry = ds[task_index]
        except Exception as exc:
            raise TaskError(
                f"dataset {name!r} item {task_index} cannot be generated: {type(exc).__name__}"
            ) from None
        answer = entry.get("answer")
        return Task(
            name, task_index, str(entry["question"]), None if answer is None else str(answer), entry
        )

    def task_for(self, assignment: Assignment) -> Task:
        """The task an assignment names."""
        return self.task(assignment.dataset, assignment.task_index)

    def score(self, task: Task, completion_text: str, log: PartialCreditLog | None = None) -> Score:
        """Score a completion with the dataset's scorer; partial credit is counted in `log`."""
        s = score_answer(self.dataset(task.dataset), task.entry, completion_text)
        if log is not None:
            log.add(task.dataset, s)
        return s


# ------------------------------------------------------------------------------ rewards


def extract_answer(text: str) -> str | None:
    """The stripped content of the last `<answer>...</answer>` in `text`, or None."""
    if not isinstance(text, str):
        return None
    found = _ANSWER_RE.findall(text)
    if not found:
        return None
    return found[-1].strip()


@dataclass(frozen=True)
class Score:
    """What a dataset's scorer made of a completion."""

    reward: float  # in [0, 1]
    answer: str | None  # what was extracted (None: no answer tags)
    partial: bool  # 0 < reward < 1
    error: str | None = None  # the scorer raised or misbehaved: why


def score_answer(dataset: Any, entry: dict[str, Any], completion_text: str) -> Score:
    """Re-score a completion with the dataset's scorer, never raising.

    No answer tags → 0.0. A scorer exception, a non-number, NaN → 0.0 with `error` set.
    Values outside [0, 1] are clamped (and noted in `error`).
    """
    answer = extract_answer(completion_text)
    if answer is None:
        return Score(0.0, None, False)
    if len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, answer[:64], False, "answer too long")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = dataset.score_answer(answer, entry)
    except Exception as exc:  # third-party scorers raise anything on malformed input
        return Score(0.0, answer, False, f"scorer raised {type(exc).__name__}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return Score(0.0, answer, False, f"scorer returned {type(raw).__name__}")
    if math.isnan(value):
        return Score(0.0, answer, False, "scorer returned NaN")
    error = None
    if not 0.0 <= value <= 1.0:
        error = f"scorer returned {value!r}, clamped"
        value = min(1.0, max(0.0, value))
    return Score(value, answer, 0.0 < value < 1.0, error)


class PartialCreditLog:
    """Which scorer gave partial credit (or failed), counted per dataset."""

    def __init__(self) -> None:
        self.scored: dict[str, int] = {}
        self.partial: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.examples: dict[str, list[tuple[str | None, float]]] = {}

    def add(self, dataset: str, score: Score) -> None:
        """Count one score of `dataset`, keeping a few examples of partial credit."""
        self.scored[dataset] = self.scored.get(dataset, 0) + 1
        if score.partial:
            self.partial[dataset] = self.partial.get(dataset, 0) + 1
            ex = self.examples.setdefault(dataset, [])
            if len(ex) < 5:
                ex.append((score.answer, score.reward))
        if score.error is not None:
            self.errors[dataset] = self.errors.get(dataset, 0) + 1

    def summary(self) -> dict[str, dict[str, int]]:
        """Per dataset: scored, partial-credit and error counts."""
        return {
            name: {
                "scored": n,
                "partial": self.partial.get(name, 0),
                "errors": self.errors.get(name, 0),
            }
            for name, n in sorted(self.scored.items())
        }
