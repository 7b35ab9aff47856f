"""The trainer on 2 gloo ranks (spawned processes, `trainer.distributed`) takes the same
steps as one process: loss and gradients equal within tolerance, every rank ends each
step with the same weights, and after the first step (one micro-batch per rank) the bf16
version a rank-0 publisher exports is byte-identical to the one-process export."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import dist_step
from trainer.distributed import RankEnv, RankError, rank_device
from trainer.engine_hf import torch_threads
from trainer.model_dir import load_model_dir
from trainer.train_loop import Trainer

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300
TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Any], list[int]]:
    """(one-process records, rank-0 records, the followers' exit codes)."""
    tmp = tmp_path_factory.mktemp("dist")
    model_dir = dist_step.build_model_dir(tmp / "model")
    out = tmp / "rank0.pt"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.dist_step", str(model_dir), str(out), "2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranked = torch.load(out, weights_only=False)
    with torch_threads(1):
        model, tok = load_model_dir(model_dir)
        alone = Trainer.from_manifest(
            model, tok, dist_step.manifest(), step_settings=dist_step.STEP
        )
        single = dist_step.run_steps(alone)
    return single, ranked["records"], ranked["codes"]


@pytest.mark.slow
def test_two_ranks_take_the_same_steps_as_one_process(runs):
    single, ranked, codes = runs
    assert codes == [0]  # the follower stopped when rank 0 said so
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
