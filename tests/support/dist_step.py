"""The same training steps on one process and on W gloo ranks (`trainer.distributed`).

`python -m tests.support.dist_step MODEL_DIR OUT W` is rank 0 of W ranks on this machine,
started as `swarm-node start --role trainer --nproc W` starts them
(`node.roles.trainer.start_ranks`: the others run `python -m trainer.follower`); under
torchrun (`torchrun --nproc-per-node W -m tests.support.dist_step MODEL_DIR OUT 1`) rank 0
meets the ranks torchrun started and the others follow, as `swarm-node start` does there.
Rank 0 shares the setup, trains `STEPS` and writes each step's loss, clipped gradients and
bf16 export (what a publisher would send) to OUT, with whether every rank held the same
weights after it. `run_steps` is the same on one process, for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from node.run_file import manifest_from_table
from trainer import tiny_policy as tp
from trainer.checkpoint import from_state_dict, snapshot_state
from trainer.micro_step import StepSettings
from trainer.model_dir import load_model_dir, save_model_dir
from trainer.samples import Sample
from trainer.train_loop import Trainer

STEP = StepSettings(micro_batch=2, logit_chunk=7)
# groups per step, 2 samples a group: 2, 3 and 1 micro-batches of 2 sequences
STEPS = (2, 3, 1)


def build_model_dir(path: Path) -> Path:
    """A small model of the built-in policy's kind, saved as a model directory."""
    tok = tp.build_tokenizer(seed=0)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    return save_model_dir(model, tok, path)


def manifest() -> Any:
    """A run manifest of groups of 2 (the loss and learning rate of the default run)."""
    table = {
        "run": {"id": "dist-test", "seed": 3},
        "datasets": [{"name": "basic_arithmetic", "weight": 1}],
    }
    return manifest_from_table(table)


def step_groups(vocab: int) -> list[list[list[Sample]]]:
    """Each step's groups: seeded samples of mixed lengths and temperatures, rewards 1 and 0
    in every group (no flat group), sampler log-probs around -3."""
    g = torch.Generator().manual_seed(7)
    steps = []
    for k, n_groups in enumerate(STEPS):
        groups = []
        for j in range(n_groups):
            group = []
            for i in range(2):
                n_p = int(torch.randint(2, 9, (1,), generator=g))
                n_c = int(torch.randint(1, 12, (1,), generator=g))
                p = tuple(int(x) for x in torch.randint(1, vocab, (n_p,), generator=g))
                c = tuple(int(x) for x in torch.randint(1, vocab, (n_c,), generator=g))
                lp = tuple((-3.0 + torch.randn(n_c, generator=g)).tolist())
                temp = (1.0, 0.7)[(i + j) % 2]
                group.append(Sample(p, c, lp, temp, 0, (b"p", k, j), float(i == 0), 0.0))
            groups.append(group)
        steps.append(groups)
    return steps


def record(trainer: Trainer, stats: dict[str, float], agree: bool) -> dict[str, Any]:
    """One step's loss, clipped gradients, bf16 export bytes and whether the ranks agree."""
    state = snapshot_state(trainer.model.state_dict(), "bfloat16")
    return {
        "loss": stats["loss"],
        "kl": stats["kl"],
        "grads": [p.grad.detach().clone() for p in trainer.model.parameters()],
        "export": from_state_dict(state),
        "agree": agree,
    }


def run_steps(trainer: Trainer) -> list[dict[str, Any]]:
    """`STEPS` on `trainer` (rank 0 or alone), one record each."""
    out = []
    for groups in step_groups(trainer.model.config.vocab_size):
        stats = trainer.train_on(groups)
        out.append(record(trainer, stats, trainer.ranks_agree()))
    return out


def main(model_dir: str, out: str, nproc: int) -> None:
    """Rank 0 of the trainer's ranks, or (under torchrun) a follower (module docstring)."""
    from node.roles.config import ModelChoice, TrainerConfig
    from node.roles.trainer import start_ranks
    from trainer.distributed import RankEnv, stop_local
    from trainer.follower import follow

    torch.set_num_threads(1)
    env = RankEnv.from_env()
    if env is not None and env.rank > 0:
        follow(env, "cpu", 1)
        return
    model, tok = load_model_dir(model_dir)
    config = TrainerConfig(model=ModelChoice(threads=1), nproc=nproc)
    m = manifest()
    ranks, procs = start_ranks(config, "cpu", Path(model_dir), m, STEP)
    try:
        trainer = Trainer.from_manifest(model, tok, m, step_settings=STEP, ranks=ranks)
        records = run_steps(trainer)
        trainer.close()
    finally:
        stop_local(procs)
    torch.save({"records": records, "codes": [p.returncode for p in procs]}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
