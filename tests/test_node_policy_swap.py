"""Hot swap between batches, the staleness wait, and per-version models for audits, on
real peers (py-libp2p on loopback) and a small real model."""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path

import pytest
import torch
import trio

from node.peer.peer import PeerConfig, open_peer
from node.roles.policy_versions import HeldVersions, HotSwap, load_weights
from node.roles.publisher import perturb
from node.testing.records import net_manifest
from node.weights.sync import WeightSettings
from protocol.identity import Identity
from tests.support import polling
from trainer.checkpoint import from_state_dict, to_state_dict
from trainer.tiny_policy import build_model, build_tokenizer

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    tok = build_tokenizer(seed=0)
    return build_model(
        tok,
        seed=1,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )


def _cfg(tmp: Path, name: str, manifest, identity=None, **kw) -> PeerConfig:  # type: ignore[no-untyped-def]
    return PeerConfig(
        manifest=manifest,
        identity=identity or Identity.generate(),
        data_dir=tmp / name,
        roles=("inference",),
        weights=WeightSettings(),
        **kw,
    )


until = functools.partial(polling.until, timeout=90.0)


def _same(m, state) -> bool:  # type: ignore[no-untyped-def]
    own = m.state_dict()
    return all(torch.equal(own[k], v.to(own[k].dtype)) for k, v in state.items())


async def test_hot_swap_staleness_wait_and_audit_models(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    trainer = Identity.generate()
    manifest = dataclasses.replace(
        net_manifest("swap"), trainer_keys=(trainer.peer_id,), max_staleness=1
    )
    v0 = from_state_dict(model.state_dict())
    async with open_peer(_cfg(tmp_path, "t", manifest, trainer)) as t:
        async with open_peer(
            _cfg(tmp_path, "w", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as w:
            await t.weights.adopt_base(v0)
            await w.weights.adopt_base(v0)
            worker_model = copy.deepcopy(model)
            swap = HotSwap(w, worker_model, version=0)
            said: list[str] = []
            assert await swap.before_batch(said.append) == 0  # nothing newer: no swap

            s1 = perturb(to_state_dict(v0), 1)
            assert await t.weights.publish(s1) == 1
            await until("v1 installed at the worker", lambda: w.weights.newest() == 1)
            assert await swap.before_batch(said.append) == 1  # between two batches
            assert _same(worker_model, s1) and not _same(worker_model, model.state_dict())
            assert swap.swaps.keys() == {1}

            # A version announced 2 ahead (S = 1) and not installed: the worker waits.
            w.weights.target = 3
            with trio.move_on_after(1.0) as waited:
                await swap.before_batch(said.append)
            assert waited.cancelled_caught
            assert any("waiting for policy version 2" in line for line in said)
            w.weights.target = 1

            s2 = perturb(s1, 2)
            await t.weights.publish(s2)
            await until("v2 installed", lambda: w.weights.newest() == 2)
            # A validator audits a rollout of version 1 after 2 is installed: one model,
            # which takes the weights of the version being audited.
            held = HeldVersions(copy.deepcopy(model))
            await held.fetch(w, 1)
            m1 = held.get(1)
            assert m1 is not None and _same(m1, s1)
            await held.fetch(w, 2)
            m2 = held.get(2)
            assert m2 is m1 and _same(m2, s2)
            assert held.get(1) is m1 and _same(m1, s1)  # and back, from the memory map
            await held.fetch(w, 9)  # never announced: not waited for
            assert held.get(9) is None and not held.holds(9)


def test_load_weights_refuses_a_foreign_checkpoint(model) -> None:  # type: ignore[no-untyped-def]
    from node.errors import CommandError

    m = copy.deepcopy(model)
    with pytest.raises(CommandError, match="lacks"):
        load_weights(m, {"model.norm.weight": torch.ones(32)})
    with pytest.raises(CommandError, match="the model lacks"):
        load_weights(m, {**model.state_dict(), "extra": torch.ones(1)})
