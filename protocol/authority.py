"""Who may judge rollouts: the run manifest's validator keys and trainer-signed delegations.

A pure table, no IO. The run manifest names `validator_keys` (fixed for the run) and
`trainer_keys`; a trainer key may grant the right to judge to another key, or revoke it
(from a delegated key or a listed one), by signing a `protocol.wire.Delegation`. For each
validator key the newest delegation wins, ordered by `(timestamp_ms, seq)` of its envelope,
so an old grant echoing through gossip never undoes a later revocation. A key with no
delegation may judge exactly when the manifest lists it.

Public API
----------
`Authority(validator_keys, trainer_keys, max_delegations=4096)`
    `.may_judge(key) -> bool`
    `.apply(signer, validator, granted, order) -> bool`   a delegation signed by `signer`
        (must be a trainer key, else `PermissionError`); `order` is `(timestamp_ms, seq)`;
        returns whether it changed the table (False for an older or equal one)
    `.may_delegate(key) -> bool`
    `.set_keys(validator_keys, trainer_keys)`   a newer run release's keys
    `.fail(key)`   the key equivocated (`protocol.equivocation`): from now on it may
        neither judge, nor delegate, nor sign policy versions (`.failed(key)`), whatever
        the manifest or a delegation says
    `.judges() -> int`   how many keys may judge now (the manifest's and delegated ones)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["Authority"]


class Authority:
    """The run's judges (see the module docstring)."""

    def __init__(
        self,
        validator_keys: Iterable[bytes] = (),
        trainer_keys: Iterable[bytes] = (),
        max_delegations: int = 4096,
    ) -> None:
        self.validator_keys = frozenset(validator_keys)
        self.trainer_keys = frozenset(trainer_keys)
        self.max_delegations = max_delegations
        # validator key -> (order of the newest delegation, granted)
        self._delegations: OrderedDict[bytes, tuple[tuple[int, int], bool]] = OrderedDict()
        self._failed: set[bytes] = set()
        self._judges: int | None = None  # `judges()`, until the table changes

    def set_keys(self, validator_keys: Iterable[bytes], trainer_keys: Iterable[bytes]) -> None:
        """A newer release of the run names these keys (`protocol.run_manifest`); the
        delegations held stay, each still the newest word on its key."""
        self.validator_keys = frozenset(validator_keys)
        self.trainer_keys = frozenset(trainer_keys)
        self._judges = None

    def fail(self, key: bytes) -> None:
        """`key` equivocated: it loses every right the run gave it, for good."""
        self._failed.add(bytes(key))
        self._judges = None

    def failed(self, key: bytes) -> bool:
        """Whether `key` equivocated (`fail`)."""
        return key in self._failed

    def may_delegate(self, key: bytes) -> bool:
        """Whether `key` may grant or revoke the right to judge (a trainer key)."""
        return key in self.trainer_keys and key not in self._failed

    def may_judge(self, key: bytes) -> bool:
        """Whether `key` may judge now: its latest delegation decides, else the run's validator
        keys."""
        if key in self._failed:
            return False
        d = self._delegations.get(key)
        if d is not None:
            return d[1]
        return key in self.validator_keys

    def ever_named(self, key: bytes) -> bool:
        """Whether the manifest or any delegation we hold names `key` (granted or not): a
        key never named could not have been authorized in any honest relay's view either,
        except by a delegation that has not reached us yet."""
        return key in self.validator_keys or key in self._delegations

    def apply(self, signer: bytes, validator: bytes, granted: bool, order: tuple[int, int]) -> bool:
        """Apply a trainer-signed grant or revocation for `validator`; False if an equal or newer
        `order` (timestamp, seq) was applied before."""
        if not self.may_delegate(signer):
            raise PermissionError("delegation not signed by a trainer key")
        old = self._delegations.get(validator)
        if old is not None and old[0] >= order:
            return False
        self._delegations[validator] = (order, bool(granted))
        self._delegations.move_to_end(validator)
        self._judges = None
        # Bounded: forget the oldest grants first (revocations of listed keys are kept
        # as long as room allows; a forgotten grant simply has to be re-sent).
        while len(self._delegations) > self.max_delegations:
            self._delegations.popitem(last=False)
        return True

    def judges(self) -> int:
        """How many keys may judge now."""
        if self._judges is None:
            keys = set(self.validator_keys) | {k for k, (_, g) in self._delegations.items() if g}
            self._judges = sum(self.may_judge(k) for k in keys)
        return self._judges

    def delegated(self) -> dict[bytes, bool]:
        """Every delegation held: key -> granted."""
        return {k: g for k, (_, g) in self._delegations.items()}
