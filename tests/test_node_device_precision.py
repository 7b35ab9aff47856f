"""`--device` on every role, threads from the cores available, workers at the run's
precision, bf16 autocast in the trainer over an fp32 master, and a worker whose device
cannot compute at the run's precision refused at start (one line) instead of banned later.
CUDA paths run only where torch sees a GPU."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from node.config import load_config
from node.errors import CommandError
from node.local_model import check_device
from node.resources import available_cores
from node.roles import check_local
from node.run_file import manifest_from_table
from node.settings import role_config, role_threads
from trainer import devices
from trainer.engines import open_engine
from trainer.loss import LossSettings
from trainer.micro_step import StepSettings, accumulate_gradients
from trainer.samples import Sample

NO_GPU = not torch.cuda.is_available()


def _manifest(precision: str = "fp32"):  # type: ignore[no-untyped-def]
    table = {
        "run": {"id": "device-test", "seed": 3, "model": "builtin:tiny"},
        "datasets": [{"name": "basic_arithmetic", "weight": 1}],
        "verification": {"precision": precision},
    }
    return manifest_from_table(table)


# ------------------------------------------------------------------ the config tree


def test_every_role_takes_device_and_threads_default_to_the_cores(tmp_path: Path) -> None:
    for role in ("inference", "validator", "trainer"):
        cfg = load_config(None, {"node.role": role, "node.device": "cpu"})
        rc = role_config(cfg, data_dir=tmp_path, max_rollouts=None, local_train=None)
        assert rc.model.device == "cpu", role  # type: ignore[union-attr]
        assert rc.model.threads == available_cores(), role  # type: ignore[union-attr]
    assert load_config().node.device == "auto"
    assert available_cores() == len(os.sched_getaffinity(0))
    assert role_threads(load_config(None, {"node.threads": 3})) == 3
    # a trainer's ranks share the cores
    cfg = load_config(None, {"node.role": "trainer", "trainer.nproc": 2})
    assert role_threads(cfg) == max(1, available_cores() // 2)
    with pytest.raises(CommandError, match="node.device"):
        load_config(None, {"node.device": "tpu"})


# ------------------------------------------------------------------ device and precision


def test_a_cpu_computes_both_precisions() -> None:
    assert devices.precision_problem("cpu", "fp32") is None
    assert devices.precision_problem("cpu", "bf16") is None
    assert check_device("cpu", "bf16") == "cpu"
    assert devices.resolve_device("auto") == ("cpu" if NO_GPU else "cuda")
    assert devices.precision_dtype("bf16") == torch.bfloat16


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_device_cuda_without_a_gpu_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no CUDA GPU") as exc:
        check_device("cuda", "fp32")
    assert "\n" not in str(exc.value)
    cfg = load_config(None, {"node.role": "inference", "node.device": "cuda"})
    rc = role_config(cfg, data_dir=tmp_path, max_rollouts=None, local_train=None)
    with pytest.raises(CommandError, match="no CUDA GPU"):
        check_local("inference", rc, _manifest())  # at start, before the network


def test_a_gpu_without_bf16_refuses_a_bf16_run_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "resolve_device", lambda name: "cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    import node.local_model as local_model

    monkeypatch.setattr(local_model, "resolve_device", lambda name: "cuda")
    with pytest.raises(CommandError) as exc:
        check_device("auto", "bf16")
    line = str(exc.value)
    assert "bf16" in line and "Tesla T4" in line and "\n" not in line
    assert check_device("auto", "fp32") == "cuda"  # fp32 it can


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_a_bf16_capable_gpu_meets_a_bf16_run() -> None:
    if torch.cuda.is_bf16_supported(including_emulation=False):
        assert check_device("cuda", "bf16") == "cuda"


# ------------------------------------------------------------------ workers at the run's precision


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.dist_step import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_hf_worker_generates_at_the_runs_precision(tiny_dir: Path, precision: str) -> None:
    from trainer.engine import SamplingSettings

    engine = open_engine(tiny_dir, batch_size=2, threads=1, precision=precision, device="cpu")
    want = torch.float32 if precision == "fp32" else torch.bfloat16
    assert next(engine.model.parameters()).dtype == want
    out = engine.generate([[1, 2, 3], [4, 5]], SamplingSettings(max_new_tokens=4), [1, 2])
    assert [len(g.completion_ids) for g in out] == [len(g.logprobs) for g in out]
    assert all(g.hidden.device.type == "cpu" for g in out)


@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_the_hf_worker_generates_on_the_gpu(tiny_dir: Path) -> None:
    from trainer.engine import SamplingSettings

    engine = open_engine(tiny_dir, batch_size=2, threads=1, device="cuda")
    assert next(engine.model.parameters()).device.type == "cuda"
    out = engine.generate([[1, 2, 3]], SamplingSettings(max_new_tokens=4), [1])
    assert out[0].hidden.device.type == "cpu"


# ------------------------------------------------------------------ bf16 autocast, fp32 master


def _samples(vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(4):
        p = tuple(int(x) for x in torch.randint(1, vocab, (5,), generator=g))
        c = tuple(int(x) for x in torch.randint(1, vocab, (6,), generator=g))
        out.append(Sample(p, c, (-3.0,) * 6, 1.0, 0, (b"p", 0, i // 2), float(i % 2), 0.0))
    return out


def test_bf16_autocast_keeps_an_fp32_master(tiny_dir: Path) -> None:
    from trainer.model_dir import load_model_dir

    model, _ = load_model_dir(tiny_dir)
    samples = _samples(model.config.vocab_size)
    advs = [0.5, -0.5, 0.5, -0.5]
    loss = LossSettings()
    values = {}
    for amp in (False, True):
        model.zero_grad(set_to_none=True)
        step = StepSettings(micro_batch=2, autocast=amp)
        values[amp], _ = accumulate_gradients(model, samples, advs, 0, loss, step)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert values[True] == pytest.approx(values[False], abs=0.05)  # bf16 rounding, same loss
    # on its own (None): on only where the device computes bf16 natively, never on a CPU
    assert dataclasses.replace(StepSettings(), autocast=None).autocast is None
    from trainer.micro_step import autocast_wanted

    assert autocast_wanted(StepSettings(), torch.device("cpu")) is False


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_inference_role_loads_its_engine_at_the_runs_precision(
    tiny_dir: Path, precision: str
) -> None:
    from node.roles.config import InferenceConfig, ModelChoice
    from node.roles.inference import load

    config = InferenceConfig(
        model=ModelChoice(model=str(tiny_dir), threads=1, device="cpu"), batch_size=2
    )
    engine = load(config, _manifest(precision))
    want = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    assert {p.dtype for p in engine.model.parameters()} == {want}
