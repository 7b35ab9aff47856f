"""bench learn's sapo figures: the summary arithmetic, and the untrained control probes
exactly what the peers probe."""

from __future__ import annotations

import zlib

import pytest
import torch

from swarm_node_bench import learn
from swarm_node_bench.parts import learn_sapo
from trainer import tiny_policy as tp
from trainer.tasks import Score, TaskSet


def _totals(iso, shared, no_is):
    return {(8, 0, 2.0): iso, (4, 4, 2.0): shared, (4, 4, 0.0): no_is}


def test_summary_ratios_and_gains():
    totals = _totals([4.0, 4.2], [5.0, 5.2], [4.5, 4.7])
    out = learn_sapo.sapo_summary(totals, [3.0, 3.2], [(8, 0), (4, 4)])
    assert out["untrained_cumulative_reward"] == 3.1
    assert out["8/0"]["ratio_vs_isolated"] == 1.0
    assert out["8/0"]["gain_ratio_vs_isolated"] == 1.0
    assert out["8/0"]["gain_se"] == 0.0  # paired by seed: the gains are 1.0 and 1.0
    four = out["4/4"]
    assert four["cumulative_reward_mean"] == 5.1
    assert four["cumulative_reward_sd"] == pytest.approx(0.141, abs=1e-3)
    assert four["ratio_vs_isolated"] == pytest.approx(5.1 / 4.1, abs=1e-3)
    assert four["gain_vs_untrained"] == 2.0
    assert four["gain_ratio_vs_isolated"] == 2.0
    assert four["ratio_vs_isolated_no_is"] == pytest.approx(4.6 / 4.1, abs=1e-3)
    assert four["cumulative_reward_mean_no_is"] == 4.6
    assert four["gain_ratio_vs_isolated_no_is"] == 1.5


def test_summary_no_gain_ratio_when_training_alone_gained_nothing_or_noise():
    nothing = learn_sapo.sapo_summary(
        _totals([2.0, 4.0], [3.0, 3.0], [3.0, 3.0]), [3.5, 3.5], [(8, 0), (4, 4)]
    )
    assert nothing["8/0"]["cumulative_reward_sd"] == pytest.approx(1.414, abs=1e-3)
    assert nothing["8/0"]["gain_vs_untrained"] == -0.5
    assert nothing["4/4"]["gain_ratio_vs_isolated"] is None
    assert nothing["4/4"]["ratio_vs_isolated"] == 1.0
    # a mean gain of 0.1 with gains of -0.9 and 1.1 (se 1.0) is noise: no ratio over it
    noisy = learn_sapo.sapo_summary(
        _totals([2.1, 4.1], [3.0, 5.0], [3.0, 3.0]), [3.0, 3.0], [(8, 0), (4, 4)]
    )
    assert noisy["8/0"]["gain_vs_untrained"] == pytest.approx(0.1)
    assert noisy["8/0"]["gain_se"] == 1.0
    assert noisy["4/4"]["gain_ratio_vs_isolated"] is None
    assert noisy["4/4"]["gain_ratio_vs_isolated_no_is"] is None


def _by_text(self, task, text, log=None):
    # An untrained tiny model solves nothing, so score by the text itself: a reward that
    # differs between completions makes "same cumulative reward" mean "same completions".
    return Score(reward=float(zlib.crc32(text.encode()) % 2), answer=None, partial=False)


def test_untrained_control_probes_what_the_peers_probe(monkeypatch):
    monkeypatch.setattr(TaskSet, "score", _by_text)
    tok = tp.build_tokenizer(0)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    model.eval()
    per_peer, _w = learn_sapo.sapo_run(model, tok, 2, 1, 4, 4, 2.0, seed=3)
    control = learn_sapo.untrained_reward(model, tok, 1, seed=3)
    assert control > 0.0
    assert per_peer == [control, control]  # round 0 is probed before any training
    assert (
        learn_sapo.untrained_reward(model, tok, 1, seed=4) != control
    )  # the seed picks the probes


@pytest.mark.slow
def test_rounds_until_training_alone_gains_stop_on_budget_or_cap_and_match_fixed_rounds(
    monkeypatch,
):
    from swarm_node_bench.parts import learn_sapo as sapo

    monkeypatch.setattr(TaskSet, "score", _by_text)
    tok = tp.build_tokenizer(0)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    model.eval()
    # round 1 is probed before any training: no gain yet, so a spent budget stops it there
    r, cum, untrained, _w, stop = sapo.isolated_until_gain(model, tok, 2, [3], 5, deadline=0.0)
    assert (r, stop) == (1, "budget")
    assert cum == [untrained[0], untrained[0]] and untrained[0] == learn_sapo.untrained_reward(
        model, tok, 1, seed=3
    )
    r, cum, untrained, _w, stop = sapo.isolated_until_gain(model, tok, 2, [3], 2, deadline=None)
    assert r == 2 and stop in ("gain", "max_rounds")
    assert (
        cum == learn_sapo.sapo_run(model, tok, 2, 2, 8, 0, 2.0, seed=3)[0]
    )  # the fixed-rounds path
    assert untrained == [learn_sapo.untrained_reward(model, tok, 2, seed=3)]
    # the gain is not looked at before min_rounds: a gain after a step or two is noise
    r, _cum, _u, _w, stop = sapo.isolated_until_gain(
        model, tok, 2, [3], 4, deadline=None, min_rounds=3
    )
    assert r >= 3 and stop in ("gain", "max_rounds"), (r, stop)


@pytest.mark.slow
def test_efficiency_scores_the_reference_on_the_held_out_tasks(monkeypatch):
    from swarm_node_bench.parts import learn_swarm

    monkeypatch.setattr(TaskSet, "score", _by_text)
    monkeypatch.setattr(learn_swarm, "QUICK_TASKS", 24)
    tok = tp.build_tokenizer(0)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    model.eval()
    out, devnet = learn_swarm.efficiency(model, tok, quick=True, seconds=0.5, swarm=False)
    assert devnet is None and out["T_s"] == 0.5 and out["heldout_tasks"] == learn_swarm.QUICK_TASKS
    assert out["single"]["rollouts"] >= 16 and out["single"]["steps"] >= 1  # it trained
    gain = out["single_gain"]
    assert gain == pytest.approx(out["single_solve_rate"] - out["solve_rate_before"], abs=2e-4)
    lo, hi = out["single_ci95"]
    assert lo <= gain <= hi and (hi > lo or gain == 0.0)  # degenerate only when nothing moved
    assert all(out[k] is None for k in learn_swarm.SWARM_KEYS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sapo_grid_and_a_training_step_run_on_cuda(monkeypatch):  # pragma: no cover - GPU only
    import copy

    from swarm_node_bench.parts import learn_sapo as sapo
    from trainer.engine_hf import HFEngine
    from trainer.groups import generate_groups

    monkeypatch.setattr(TaskSet, "score", _by_text)
    tok = tp.build_tokenizer(0)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    model.eval()
    groups = generate_groups(
        HFEngine(model, tok),
        tok,
        TaskSet(5),
        [("tiny-products", k) for k in range(8)],
        group_size=4,
        settings=sapo.sampling(),
        seed=1,
    )
    on_cpu = sapo.trainer_for(copy.deepcopy(model), tok).train_on(groups)
    on_gpu = sapo.trainer_for(copy.deepcopy(model).to("cuda"), tok).train_on(groups)
    assert on_gpu["samples"] == on_cpu["samples"] > 0
    assert on_gpu["loss"] == pytest.approx(on_cpu["loss"], abs=1e-4)
    assert on_gpu["grad_norm"] == pytest.approx(on_cpu["grad_norm"], rel=1e-3)
    out = sapo.sapo(copy.deepcopy(model).to("cuda"), tok, quick=True, rounds=2)
    assert out["device"].startswith("cuda") and out["rounds"] == 2
    assert out["4/4"]["cumulative_reward_mean"] >= 0.0


def test_options_refuse_what_the_bench_cannot_run():
    from node.errors import CommandError

    for args, says in (
        (["--device", "cuda"], "--only sapo"),
        (["--policy", "qwen2-24m"], "built-in policy"),
        (["--only", "sapo,foo"], "--only takes"),
        (["--rounds", "0"], ">= 1"),
        (["--bogus"], "bad arguments"),
    ):
        with pytest.raises(CommandError, match=says):
            learn.options(args)
    opts = learn.options(
        ["--only", "sapo", "--device", "cuda", "--policy", "qwen2-24m", "--sapo-budget-s", "300"]
    )
    assert (opts.device, opts.policy, opts.sapo_budget_s) == ("cuda", "qwen2-24m", 300.0)
