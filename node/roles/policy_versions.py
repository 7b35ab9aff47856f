"""A role's loaded policy at the right version: hot swap (inference), per-version models
(validators).

Inference (`HotSwap`): between two batches the worker swaps its model's weights to the
newest installed version (`peer.weights`), without restarting. It never generates for a
version beyond the staleness bound: when the newest *announced* version t is more than
S = `max_staleness` ahead of what it holds, it waits for the download (saying so, with
rate and ETA) before the next batch. The version a batch was generated with is what its
rollouts carry.

Validators (`HeldVersions`): a rollout is audited with the version it claims, so a
validator keeps one model per recent version, built from the base model and the
installed checkpoint of that version (a version it cannot load leaves those records
unjudged).

Loading: `load_weights(model, state)` copies a checkpoint's tensors into a loaded model
(dtype converted by torch); it refuses a checkpoint with unknown tensors or missing ones
other than tied duplicates, so a wrong checkpoint never silently half-loads.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import trio

from node.errors import CommandError
from node.peer.ports import WeightsView

WAIT_SLICE_S = 30.0
FETCH_WAIT_S = 30.0  # a validator waits this long for an announced version to install


def load_weights(model: Any, state: dict[str, Any]) -> None:
    """Copy `state` into `model` in place (blocking: call in a thread)."""
    import torch  # deferred: heavy import

    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise CommandError(f"checkpoint holds tensors the model lacks: {unknown[:3]}")
    missing = set(own) - set(state)
    tied = {n for n in missing if _tied(model, n, state)}
    if missing - tied:
        raise CommandError(f"checkpoint lacks tensors of the model: {sorted(missing - tied)[:3]}")
    with torch.no_grad():
        model.load_state_dict(state, strict=False)


def _tied(model: Any, name: str, state: dict[str, Any]) -> bool:
    """Whether parameter `name` shares storage with one the checkpoint provides."""
    params = dict(model.named_parameters(remove_duplicate=False))
    p = params.get(name)
    if p is None:
        return False
    return any(q is p or q.data_ptr() == p.data_ptr() for n, q in params.items() if n in state)


class HotSwap:
    """The inference worker's model and the version it holds."""

    def __init__(
        self, peer: WeightsView, model: Any, version: int = 0, also_load: Any = None
    ) -> None:
        """`also_load(state)`, when given, runs after `model` took the new weights (an
        engine holding a second copy of them, e.g. vLLM's, loads it there)."""
        self.peer = peer
        self.model = model
        self.also_load = also_load
        self.version = version
        self.swaps: dict[int, float] = {}

    async def before_batch(self, say: Any) -> int:
        """Swap to the newest installed version; wait while beyond the staleness bound.
        Returns the version the next batch must be generated with."""
        weights = self.peer.weights
        if weights is None:
            return self.version
        s = self.peer.manifest.max_staleness
        while weights.target - max(self.version, weights.newest() or 0) > s:
            need = weights.target - s
            with trio.move_on_after(WAIT_SLICE_S):
                await weights.wait_installed(need, say=say)
        newest = weights.newest()
        if newest is not None and newest > self.version:
            state = await weights.load_state_dict(newest)
            await trio.to_thread.run_sync(load_weights, self.model, state)
            if self.also_load is not None:
                await trio.to_thread.run_sync(self.also_load, state)
            say(f"policy version {self.version} -> {newest} (hot swap)")
            self.version = newest
            self.swaps[newest] = time.time()
        return self.version


class HeldVersions:
    """The policy versions this validator can judge: version 0 (the model directory) and
    versions the node's weight store installed (`peer.weights`, the broadcast), loaded on
    first use into a copy of the base model; at most `KEEP` besides version 0."""

    KEEP = 2

    def __init__(self, base: Any) -> None:
        self.base = base
        self.models: dict[int, Any] = {0: base}
        self.failed: set[int] = set()

    def get(self, version: int) -> Any | None:
        """The model of `version`, when held."""
        return self.models.get(version)

    async def fetch(self, peer: WeightsView, version: int) -> None:
        """Load the model of `version` if the weight store has it (waiting a little for
        an announced one still downloading); a version that fails to load is not tried
        again."""
        weights = peer.weights
        if version in self.models or version in self.failed or weights is None:
            return
        if version not in weights.installed() and version <= weights.target:
            with trio.move_on_after(FETCH_WAIT_S):  # announced, downloading: worth a wait
                await weights.wait_installed(version)
        if version not in weights.installed():
            return
        try:
            state = await weights.load_state_dict(version)
            model = await trio.to_thread.run_sync(self._load, state)
        except (OSError, KeyError, RuntimeError, ValueError, CommandError):
            self.failed.add(version)  # not loadable here: such records stay unjudged
            return
        for old in sorted(v for v in self.models if v != 0)[: max(0, len(self.models) - self.KEEP)]:
            del self.models[old]
        self.models[version] = model

    def _load(self, state: dict[str, Any]) -> Any:
        model = copy.deepcopy(self.base)
        load_weights(model, state)  # strict, except tied tensors a checkpoint holds once
        return model.eval()
