"""The trainer on 2 gloo ranks (processes spawned as `start --nproc 2` spawns them, and
launched by torchrun) takes the same steps as one process: loss and gradients equal within
tolerance, every rank ends each step with the same weights, and after the first step (one
micro-batch per rank) the bf16 version a rank-0 publisher exports is byte-identical to the
one-process export."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from node.errors import CommandError
from tests.support import dist_step
from trainer.distributed import RankEnv, RankError, free_port, rank_device
from trainer.engine_hf import torch_threads
from trainer.model_dir import load_model_dir
from trainer.train_loop import Trainer

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300
TOL = 1e-5


LAUNCH = {
    "nproc": ["-m", "tests.support.dist_step", "{model}", "{out}", "2"],
    "torchrun": [
        *("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("-m", "tests.support.dist_step", "{model}", "{out}", "1"),
    ],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dist_step.build_model_dir(tmp_path_factory.mktemp("dist") / "model")


@pytest.fixture(scope="module")
def single(model_dir: Path) -> list[Any]:
    """The one-process records."""
    with torch_threads(1):
        model, tok = load_model_dir(model_dir)
        alone = Trainer.from_manifest(
            model, tok, dist_step.manifest(), step_settings=dist_step.STEP
        )
        return dist_step.run_steps(alone)


@pytest.fixture(scope="module", params=sorted(LAUNCH))
def runs(
    request: pytest.FixtureRequest, model_dir: Path, single: list[Any]
) -> tuple[list[Any], list[Any], list[int]]:
    """(one-process records, rank-0 records, the spawned followers' exit codes), the ranks
    launched as `start --nproc 2` launches them, or by torchrun."""
    out = model_dir.parent / f"rank0-{request.param}.pt"
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    argv = [a.format(model=model_dir, out=out) for a in LAUNCH[request.param]]
    proc = subprocess.run(
        [sys.executable, *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranked = torch.load(out, weights_only=False)
    return single, ranked["records"], ranked["codes"]


@pytest.mark.slow
def test_two_ranks_take_the_same_steps_as_one_process(runs):
    single, ranked, codes = runs
    assert codes in ([0], [])  # a spawned follower stopped when rank 0 said so
    assert len(single) == len(ranked) == len(dist_step.STEPS)
    for k, (a, b) in enumerate(zip(single, ranked, strict=True)):
        assert b["agree"], f"step {k}: the ranks hold different weights"
        assert b["loss"] == pytest.approx(a["loss"], abs=TOL), k
        for ga, gb in zip(a["grads"], b["grads"], strict=True):
            assert torch.allclose(ga, gb, atol=TOL, rtol=1e-4), k
        assert any(float(g.abs().sum()) > 0 for g in a["grads"])  # a step that moved


@pytest.mark.slow
def test_a_published_version_is_byte_identical_after_a_step(runs):
    single, ranked, _ = runs
    # step 0: 2 micro-batches, one per rank; the all-reduced sum is the one-process sum
    assert ranked[0]["export"] == single[0]["export"]
    pairs = zip(single[0]["grads"], ranked[0]["grads"], strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_a_rank_without_world_size_is_a_one_line_error(monkeypatch):
    from node.commands import start
    from node.config import load_config

    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(CommandError, match="WORLD_SIZE"):
        start.main(load_config(None, {"node.role": "trainer", "node.device": "cpu"}))


def test_rank_env_reads_torchruns_variables():
    assert RankEnv.from_env({}) is None
    assert RankEnv.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert RankEnv.from_env({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"}) == RankEnv(2, 4, 0)
    with pytest.raises(RankError, match="outside"):
        RankEnv.from_env({"WORLD_SIZE": "2", "RANK": "2"})
    with pytest.raises(RankError, match="integers"):
        RankEnv.from_env({"WORLD_SIZE": "two"})
    assert rank_device("cuda", 3) == torch.device("cuda", 3)
    assert rank_device("cpu", 3) == torch.device("cpu")


@pytest.mark.slow
def test_a_spawned_rank_exits_when_rank_0_dies(tmp_path):
    """Rank 0 killed without a word: the rank it spawned, waiting to meet it, exits."""
    import psutil

    pid_file = tmp_path / "follower.pid"
    script = (
        f"SWARM_NODE_RANK0_PID=$$ RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
        f"MASTER_PORT={free_port()} {sys.executable} -m trainer.follower --device cpu & "
        f"echo $! > {pid_file}; sleep 1"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    subprocess.run(["bash", "-c", script], env=env, cwd=ROOT, timeout=60, check=True)
    follower = psutil.Process(int(pid_file.read_text()))
    try:
        follower.wait(timeout=60)  # its parent is gone: it exits within the watchdog's poll
    except psutil.TimeoutExpired:
        follower.kill()
        raise


@pytest.mark.slow
@pytest.mark.network
def test_start_trainer_with_nproc_2_runs_and_stops_its_ranks(model_dir, tmp_path):
    """`swarm-node start --role trainer --nproc 2`: rank 0 on the network, one spawned rank;
    at the end of --duration both stop (exit 0, no rank left)."""
    import psutil

    from node.keyfile import write_key
    from node.run_file import manifest_from_table, manifest_to_toml
    from protocol.identity import Identity
    from trainer.tiny_policy import run_manifest_table

    key = tmp_path / "node.key"
    identity = Identity.generate()
    write_key(key, identity)
    table = run_manifest_table(run_id="nproc-test", seed=1)
    table["run"]["model"] = str(model_dir)
    table["run"]["trainer_keys"] = [identity.peer_id_b58]
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    argv = [sys.executable, "-m", "node.cli", "start", "--role", "trainer", "--run", str(run)]
    argv += ["--key", str(key), "--data-dir", str(tmp_path / "d"), "--duration", "45"]
    argv += ["--nproc", "2", "--device", "cpu", "--threads", "1"]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ranks: list[Any] = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            ranks = [
                p
                for p in psutil.Process(proc.pid).children()
                if "trainer.follower" in " ".join(p.cmdline())
            ] or ranks
            time.sleep(0.5)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    assert "2 ranks (DDP)" in out, (out[-2000:], err[-2000:])
    assert len(ranks) == 1  # the spawned rank 1
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)
