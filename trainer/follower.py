"""A trainer rank other than 0: it takes part in every step rank 0 sends, until `STOP`.

Started by torchrun (every rank runs `swarm-node start --role trainer ...`; those of RANK
> 0 come here) or by rank 0 itself with `--nproc N` (`python -m trainer.follower --device
D [--threads N]`, `trainer.distributed.start_local`). It needs no key, run file or
network: rank 0 sends the setup (`RankSetup`: the model directory, which must exist at the
same path on this machine, the run manifest and the step settings), then one command at a
time:

    TRAIN groups  ->  Trainer.train_on(groups): this rank's micro-batches, DDP's all-reduce,
                      the same clip and AdamW step as every rank
    CHECK         ->  Ranks.same_weights: every rank's weights digest compared
    STOP          ->  leave the process group and exit 0
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer.distributed import (
    CHECK,
    PARENT_ENV,
    STOP,
    TRAIN,
    RankEnv,
    RankError,
    Ranks,
    rank_device,
)
from trainer.micro_step import StepSettings
from trainer.model_dir import load_model_dir
from trainer.train_loop import Trainer

PARENT_POLL_S = 2.0


@dataclass(frozen=True)
class RankSetup:
    """What rank 0 tells the others once: where the model is, the run, how a step is cut."""

    model_dir: str
    manifest: Any  # protocol.wire.RunManifest: group size, loss, learning rate
    step: StepSettings


def follow(env: RankEnv, device: str, threads: int | None = None) -> None:
    """Be rank `env.rank` (> 0) until rank 0 sends `STOP` (module docstring)."""
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    ranks = Ranks(env, rank_device(device, env.local_rank))
    try:
        setup: RankSetup = ranks.share()
        model, tokenizer = load_model_dir(setup.model_dir)
        model.to(ranks.device)
        trainer = Trainer.from_manifest(
            model, tokenizer, setup.manifest, step_settings=setup.step, ranks=ranks
        )
        while True:
            command, payload = ranks.receive()
            if command == STOP:
                return
            if command == TRAIN:
                trainer.train_on(payload)
            elif command == CHECK:
                ranks.same_weights(model)
            else:
                raise RankError(f"rank {env.rank}: unknown command {command!r} from rank 0")
    finally:
        ranks.close()


def main(argv: list[str] | None = None) -> None:
    """`python -m trainer.follower --device D [--threads N]` under torchrun's environment."""
    parser = argparse.ArgumentParser(prog="python -m trainer.follower")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    env = RankEnv.from_env()
    if env is None or env.rank == 0:
        parser.error("run as a rank > 0 (RANK and WORLD_SIZE set, as torchrun does)")
    die_with_parent(os.environ.get(PARENT_ENV))
    follow(env, args.device, args.threads)


def die_with_parent(parent_pid: str | None) -> None:
    """A rank spawned by rank 0 exits within `PARENT_POLL_S` of rank 0's death, however
    rank 0 died (a watchdog thread; the rank itself may be blocked in a collective)."""
    if not parent_pid:
        return

    def watch() -> None:
        while str(os.getppid()) == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # rank 0 is gone: nothing to clean up that its death did not end

    threading.Thread(target=watch, name="rank0-watchdog", daemon=True).start()


if __name__ == "__main__":
    main()
