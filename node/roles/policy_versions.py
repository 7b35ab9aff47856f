"""A role's loaded policy at the right version: hot swap (inference), per-version models
(validators).

Inference (`HotSwap`): between two batches the worker swaps its model's weights to the
newest installed version (`peer.weights`), without restarting. It never generates for a
version beyond the staleness bound: when the newest *announced* version t is more than
S = `max_staleness` ahead of what it holds, it waits for the download (saying so, with
rate and ETA) before the next batch. The version a batch was generated with is what its
rollouts carry.

Validators (`HeldVersions`): a rollout is audited with the version it claims. A validator
holds one model and the recent versions memory-mapped (the run's staleness + 1 of them);
the model takes a version's weights when that version's records are audited (a version
it cannot load leaves those records unjudged).

Loading: `load_weights(model, state)` copies a checkpoint's tensors into a loaded model
(dtype converted by torch), tensor by tensor from the version's memory map; it refuses a checkpoint with unknown tensors or missing ones
other than tied duplicates, so a wrong checkpoint never silently half-loads.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from node.errors import CommandError
from node.peer.ports import WeightsView

WAIT_SLICE_S = 30.0
FETCH_WAIT_S = 30.0  # a validator waits this long for an announced version to install


def load_weights(model: Any, state: dict[str, Any]) -> None:
    """Copy `state` into `model` in place, tensor by tensor (blocking: call in a thread).
    `state` may be memory-mapped (`WeightSync.load_state_dict`): each tensor is read
    from the page cache straight into the parameter, no second copy of the model."""
    import torch  # deferred: heavy import

    check_weights(model, state)
    with torch.no_grad():
        model.load_state_dict(state, strict=False)


def check_weights(model: Any, state: dict[str, Any]) -> None:
    """`CommandError` unless `state` names exactly the model's tensors (tied duplicates
    may be missing) in their shapes; reads no tensor data."""
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise CommandError(f"checkpoint holds tensors the model lacks: {unknown[:3]}")
    missing = set(own) - set(state)
    tied = {n for n in missing if _tied(model, n, state)}
    if missing - tied:
        raise CommandError(f"checkpoint lacks tensors of the model: {sorted(missing - tied)[:3]}")
    wrong = sorted(n for n, t in state.items() if tuple(t.shape) != tuple(own[n].shape))
    if wrong:
        raise CommandError(f"checkpoint tensors of another shape than the model's: {wrong[:3]}")


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
    """The policy versions this validator can judge, with one model: the versions are
    held memory-mapped from the node's weight store (`peer.weights`, the broadcast), the
    newest `keep_for(manifest)` of them, and the model takes a version's weights when
    records of that version are audited (`get`, in the audit thread). Version 0 is the
    model as loaded until another version replaces it, and held mapped like the others
    once the store has it. A version that does not fit the model is not tried again."""

    def __init__(self, base: Any) -> None:
        self.model = base
        self.loaded = 0  # the version whose weights the model holds
        self.states: dict[int, dict[str, Any]] = {}  # memory-mapped, by version
        self.failed: set[int] = set()

    @staticmethod
    def keep_for(manifest: Any) -> int:
        """How many versions a validator holds: the run accepts rollouts of the newest
        version and of `max_staleness` versions before it."""
        return int(manifest.max_staleness) + 1

    def holds(self, version: int) -> bool:
        """Whether records of `version` can be judged now (no model work)."""
        return version in self.states or (version == self.loaded and version not in self.failed)

    def get(self, version: int) -> Any | None:
        """The model with the weights of `version` (copied from its memory map when the
        model holds another one: blocking, call it where the model is used), or None."""
        if version != self.loaded:
            state = self.states.get(version)
            if state is None:
                return None
            load_weights(self.model, state)
            self.loaded = version
        return self.model

    async def fetch(self, peer: WeightsView, version: int) -> None:
        """Map `version` if the weight store has it (waiting a little for an announced one
        still downloading), dropping the oldest beyond `keep_for`; a version that does not
        load is not tried again."""
        weights = peer.weights
        if version in self.states or version in self.failed or weights is None:
            return
        if version == self.loaded and version not in weights.installed():
            return  # the model as loaded holds it: nothing to wait for
        if version not in weights.installed() and version <= weights.target:
            with trio.move_on_after(FETCH_WAIT_S):  # announced, downloading: worth a wait
                await weights.wait_installed(version)
        if version not in weights.installed():
            return
        try:
            state = await weights.load_state_dict(version)
            await trio.to_thread.run_sync(check_weights, self.model, state)
        except (OSError, KeyError, RuntimeError, ValueError, CommandError):
            self.failed.add(version)  # not loadable here: such records stay unjudged
            return
        self.states[version] = state
        for old in sorted(self.states)[: max(0, len(self.states) - self.keep_for(peer.manifest))]:
            del self.states[old]
