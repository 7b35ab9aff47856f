"""Local (SAPO-style) training: I own + J foreign groups a round, a separate copy, and it
never publishes; the `--local-train I:J` option is checked."""

from __future__ import annotations

import pytest
import torch

from node.commands.start import parse_local_train
from node.errors import CommandError
from node.run_file import manifest_from_table
from trainer import tiny_policy as tp
from trainer.local_train import LocalTrainer
from trainer.samples import Sample


def _group(tok, producer, g, rewards):
    p = tuple(tok.encode("1 + 2 =\n", add_special_tokens=False))
    out = []
    for k, r in enumerate(rewards):
        c = tuple(tok.encode(f"<answer>{k}</answer>", add_special_tokens=False))
        out.append(Sample(p, c, (-1.5,) * len(c), 1.0, 0, (producer, 0, g), r, r))
    return out


def test_rounds_need_own_and_foreign_groups_and_never_publish(tok):
    table = tp.run_manifest_table("local", seed=1)
    table["run"]["group_size"] = 2
    manifest = manifest_from_table(table)
    model = tp.build_model(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    local = LocalTrainer(model, tok, manifest, own=1, foreign=1)
    for s in _group(tok, b"me", 0, [1.0, 0.0]):
        local.offer(s, own=True)
    assert local.round() is None  # no foreign group yet
    for s in _group(tok, b"other", 0, [0.0, 1.0]):
        local.offer(s, own=False)
    stats = local.round()
    assert stats is not None and stats["samples"] == 4 and local.rounds == 1
    assert abs(stats["is_weight_mean"] - 1.0) > 0.1  # importance-weighted: off-policy
    # the generating policy is untouched; the copy moved; nothing was published
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in local.model.state_dict().items())
    assert local.trainer.published == [] and local.trainer.version == 0


def test_local_train_option():
    assert parse_local_train("4:4", "inference") == (4, 4)
    assert parse_local_train(None, "trainer") is None
    for bad in ("4", "a:b", "-1:2", "0:0"):
        with pytest.raises(CommandError, match="--local-train"):
            parse_local_train(bad, "inference")
    with pytest.raises(CommandError, match="--role inference"):
        parse_local_train("4:4", "trainer")
