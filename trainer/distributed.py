"""The trainer's ranks on torch.distributed: who they are, how they talk, how they start.

Engine: DDP (`torch.nn.parallel.DistributedDataParallel`; docs/TRAINING.md says why not
FSDP2). Every rank holds the whole model, its fp32 master and the AdamW state. In a step
each rank forwards and backpropagates its share of the micro-batches
(`trainer.micro_step.accumulate_gradients`), DDP all-reduces the gradients, and every rank
clips and steps the same gradients, so every rank ends each step with the same weights.

Roles: rank 0 is the trainer the network sees (`node.roles.trainer`): it hears rollouts,
picks the groups, checkpoints and publishes. Before each step it sends the step's groups
to the other ranks (`Ranks.send`); they run `trainer.follower.follow`, which takes part in
every step it is sent until rank 0 sends `STOP`.

Launch: the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT; `RankEnv.from_env`), so `torchrun ... -m node.cli start --role trainer ...` on
each machine works across machines; or `swarm-node start --role trainer --nproc N`, where
the process started is rank 0 and spawns ranks 1..N-1 on this machine (`spawn_local`),
which meet at a TCP store that rank 0 holds on 127.0.0.1.

Channels: the gradients go over the default process group (gloo on a CPU, NCCL on CUDA,
torch's default timeout); commands and the setup over a gloo group of their own whose
timeout is `COMMAND_TIMEOUT`, because the ranks wait for the next step as long as the
trainer waits for rollouts. A rank that dies closes its sockets, and the others fail
their next collective instead of waiting.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

TRAIN = "train"  # payload: the step's groups of samples
CHECK = "check"  # every rank reports a digest of its weights (`Ranks.same_weights`)
STOP = "stop"
COMMAND_TIMEOUT = timedelta(days=7)
STEP_TIMEOUT = timedelta(minutes=30)  # the gradient all-reduce waits this long for the slowest rank
PARENT_ENV = "SWARM_NODE_RANK0_PID"  # set for ranks spawned by rank 0: they die with it
LOCAL_HOST = "127.0.0.1"


class RankError(RuntimeError):
    """The ranks cannot start or lost each other; the message is one line."""


@dataclass(frozen=True)
class RankEnv:
    """This process's place among the ranks: rank, world size, rank on this machine."""

    rank: int
    world: int
    local_rank: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankEnv | None:
        """The place torchrun (or `spawn_local`) gave this process; None when it was started
        alone (no WORLD_SIZE, or 1)."""
        env = os.environ if environ is None else environ
        try:
            world = int(env.get("WORLD_SIZE", "1"))
            rank = int(env.get("RANK", "0"))
            local = int(env.get("LOCAL_RANK", str(rank)))
        except ValueError:
            raise RankError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
        if world <= 1:
            return None
        if not 0 <= rank < world:
            raise RankError(f"RANK {rank} is outside WORLD_SIZE {world}")
        return cls(rank, world, local)


def rank_device(device: str, local_rank: int) -> torch.device:
    """The device of a rank: `cuda` is this machine's GPU number `local_rank`, `cuda:i` and
    `cpu` are taken as they are."""
    if device == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(device)


def _to_cpu(obj: Any) -> Any:
    """`obj` with every tensor in it copied to the CPU (a pickled CUDA tensor would land on
    the sender's GPU number)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class Ranks:
    """The process group as the trainer sees it (module docstring): `share` and `send` from
    rank 0, `receive` on the others, `sync_module` and `wrap` for the model, `sum` for the
    step's figures."""

    def __init__(self, env: RankEnv, device: torch.device) -> None:
        self.rank, self.world, self.device = env.rank, env.world, device
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(
                backend,
                init_method="env://",
                rank=env.rank,
                world_size=env.world,
                timeout=STEP_TIMEOUT,
            )
        except (RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RankError(f"rank {env.rank} of {env.world} cannot start: {first}") from None
        commands = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
        assert isinstance(commands, dist.ProcessGroup)
        self.commands = commands

    def share(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (others pass None); tensors travel on the CPU."""
        box = [_to_cpu(obj) if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.commands)
        return box[0]

    def send(self, command: str, payload: Any = None) -> None:
        """Rank 0: the next command for the other ranks (`TRAIN`, `CHECK`, `STOP`)."""
        assert self.rank == 0, "only rank 0 sends commands"
        self.share((command, payload))

    def receive(self) -> tuple[str, Any]:
        """Ranks > 0: wait for rank 0's next command."""
        command, payload = self.share(None)
        return command, payload

    def sync_module(self, module: torch.nn.Module) -> None:
        """Every parameter and buffer of `module` set to rank 0's."""
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def wrap(self, module: torch.nn.Module) -> DistributedDataParallel:
        """`module` under DDP. No buffer broadcast at each forward: ranks may forward a
        different number of micro-batches in a step, and the buffers (rotary tables) are
        the same on every rank already."""
        ids = [self.device.index] if self.device.type == "cuda" else None
        params = inspect.signature(DistributedDataParallel).parameters
        quiet = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
        options: dict[str, Any] = {quiet: False}
        return DistributedDataParallel(module, device_ids=ids, **options)

    def sum(self, values: Sequence[float]) -> list[float]:
        """The sums over the ranks of each of `values` (every rank gets them)."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def same_weights(self, module: torch.nn.Module) -> bool:
        """Whether every rank holds bit-identical parameters (a collective: every rank calls
        it; rank 0 sends `CHECK` first)."""
        import hashlib  # deferred: used here only

        h = hashlib.sha256()
        for name, p in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        digests: list[Any] = [None] * self.world
        dist.all_gather_object(digests, h.hexdigest(), group=self.commands)
        return len(set(digests)) == 1

    def close(self) -> None:
        """Leave the process group (idempotent)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def start_local(world: int, device: str, argv: Sequence[str]) -> tuple[Ranks, list[Any]]:
    """Rank 0 of `world` ranks on this machine: spawn ranks 1..world-1 as `argv` (a command
    that runs `trainer.follower`) with torchrun's environment, and meet them at a free port
    of 127.0.0.1 (found as torchrun's standalone mode finds one). Returns the ranks and the
    spawned processes (the caller ends them, `stop_local`)."""
    port = free_port()
    procs = spawn_local(world, port, argv)
    env = {"MASTER_ADDR": LOCAL_HOST, "MASTER_PORT": str(port)}
    try:
        os.environ.update(env)  # what env:// reads, as torchrun would have set it
        ranks = Ranks(RankEnv(0, world, 0), rank_device(device, 0))
    except BaseException:
        for p in procs:
            p.kill()
        stop_local(procs)
        raise
    return ranks, procs


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOCAL_HOST, 0))
        return int(s.getsockname()[1])


def follower_argv(device: str, threads: int | None) -> list[str]:
    """The command that runs one follower rank (`python -m trainer.follower`)."""
    argv = [sys.executable, "-m", "trainer.follower", "--device", device]
    return argv + (["--threads", str(threads)] if threads is not None else [])


def spawn_local(world: int, port: int, argv: Sequence[str]) -> list[subprocess.Popen[bytes]]:
    """Start ranks 1..world-1 of `argv` on this machine, meeting at 127.0.0.1:`port`."""
    procs = []
    for rank in range(1, world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR=LOCAL_HOST,
            MASTER_PORT=str(port),
            **{PARENT_ENV: str(os.getpid())},
        )
        procs.append(subprocess.Popen(list(argv), env=env))
    return procs


def stop_local(procs: Sequence[subprocess.Popen[bytes]], wait_s: float = 30.0) -> None:
    """End spawned ranks: wait up to `wait_s` for each (they exit on `STOP`), then kill."""
    for p in procs:
        try:
            p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=wait_s)
