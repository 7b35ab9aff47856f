"""Field types of the wire objects: what a value may be, and how it looks on the wire.

Every field of a wire dataclass names one `Spec`. A spec does three things:
- `check(value)` returns a problem string, or None when a Python value is legal;
- `to_wire(value)` gives what msgpack packs (arrays of numbers become packed little-endian bytes);
- `from_wire(raw, where)` turns what msgpack unpacked back into the Python value, raising
  `DecodeError` naming the object and field.

Rules this module must keep: no IO; no value is ever coerced (a float where an int belongs is
an error, not a rounding); every length is capped.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.errors import DecodeError
from protocol.identity import is_peer_id

_LITTLE = sys.byteorder == "little"

U8 = (0, 2**8 - 1)
U16 = (0, 2**16 - 1)
U32 = (0, 2**32 - 1)
U63 = (0, 2**63 - 1)
U64 = (0, 2**64 - 1)


class Spec:
    """Base of all field types."""

    def check(self, value: Any) -> str | None:
        """A problem string, or None when `value` is legal."""
        raise NotImplementedError

    def to_wire(self, value: Any) -> Any:
        """What msgpack packs for `value`."""
        return value

    def from_wire(self, raw: Any, obj: str, field: str) -> Any:
        """The Python value of what msgpack unpacked; `DecodeError` naming `obj.field` if illegal.
        The Python value of what msgpack unpacked; `DecodeError` naming `obj.field` if illegal."""
        problem = self.check(raw)
        if problem is not None:
            raise DecodeError(obj, field, problem)
        return raw


@dataclass(frozen=True, slots=True)
class Int(Spec):
    """An integer in [lo, hi]."""

    lo: int
    hi: int

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is an int in range."""
        if type(value) is not int:
            return f"expected an integer, got {type(value).__name__}"
        if not self.lo <= value <= self.hi:
            return f"{value} out of range [{self.lo}, {self.hi}]"
        return None


@dataclass(frozen=True, slots=True)
class Float(Spec):
    """A finite float in [lo, hi]."""

    lo: float
    hi: float

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is a finite float in range."""
        if type(value) is not float:
            return f"expected a float, got {type(value).__name__}"
        if not math.isfinite(value):
            return f"{value} is not finite"
        if not self.lo <= value <= self.hi:
            return f"{value} out of range [{self.lo}, {self.hi}]"
        return None


@dataclass(frozen=True, slots=True)
class Bool(Spec):
    """A bool."""

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is a bool."""
        if type(value) is not bool:
            return f"expected a bool, got {type(value).__name__}"
        return None


@dataclass(frozen=True, slots=True)
class Str(Spec):
    """Text of bounded length, optionally one of `choices` or within `charset`."""

    max_len: int
    min_len: int = 0
    choices: tuple[str, ...] | None = None
    charset: str | None = None  # when set, every character must be in it

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is text within the bounds."""
        if type(value) is not str:
            return f"expected a string, got {type(value).__name__}"
        if not self.min_len <= len(value) <= self.max_len:
            return f"length {len(value)} outside [{self.min_len}, {self.max_len}]"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        if self.charset is not None and not set(value) <= set(self.charset):
            return f"{value!r} has characters outside [{self.charset}]"
        return None


@dataclass(frozen=True, slots=True)
class Bytes(Spec):
    """Bytes of bounded length, or of one of `sizes`."""

    max_len: int
    min_len: int = 0
    sizes: tuple[int, ...] | None = None  # when set, the length must be one of these

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is bytes of a legal length."""
        if type(value) is not bytes:
            return f"expected bytes, got {type(value).__name__}"
        if self.sizes is not None:
            if len(value) not in self.sizes:
                return f"length {len(value)} is not one of {self.sizes}"
        elif not self.min_len <= len(value) <= self.max_len:
            return f"length {len(value)} outside [{self.min_len}, {self.max_len}]"
        return None


@dataclass(frozen=True, slots=True)
class PeerId(Spec):
    """A 38-byte Ed25519 identity-multihash peer id."""

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is an Ed25519 identity-multihash peer id."""
        if type(value) is not bytes:
            return f"expected bytes, got {type(value).__name__}"
        if not is_peer_id(value):
            return "not an Ed25519 identity-multihash peer id"
        return None


@dataclass(frozen=True, slots=True)
class _PackedArray(Spec):
    """A tuple of numbers that travels as packed little-endian bytes (compact, fast)."""

    max_len: int

    typecode = "I"
    itemsize = 4

    def _pack(self, value: Sequence[Any]) -> array:
        arr = array(self.typecode, value)
        if not _LITTLE:
            arr.byteswap()
        return arr

    def to_wire(self, value: tuple[Any, ...]) -> bytes:
        return self._pack(value).tobytes()

    def from_wire(self, raw: Any, obj: str, field: str) -> tuple[Any, ...]:
        if type(raw) is not bytes:
            raise DecodeError(obj, field, f"expected packed bytes, got {type(raw).__name__}")
        if len(raw) % self.itemsize:
            raise DecodeError(obj, field, f"{len(raw)} bytes is not a multiple of {self.itemsize}")
        arr = array(self.typecode)
        arr.frombytes(raw)
        if not _LITTLE:
            arr.byteswap()
        problem = self._check_unpacked(arr)
        if problem is not None:
            raise DecodeError(obj, field, problem)
        return tuple(arr)

    def _check_unpacked(self, arr: array) -> str | None:
        """`check` for values that came out of packed bytes: their type and width hold by
        construction, so the per-item checks of `check` are skipped."""
        if len(arr) > self.max_len:
            return f"{len(arr)} items, more than {self.max_len}"
        return None


@dataclass(frozen=True, slots=True)
class U32Array(_PackedArray):
    """Token ids: a tuple of ints in [0, 2**32)."""

    typecode = "I"
    itemsize = 4

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is a tuple of at most `max_len` uint32s."""
        if type(value) is not tuple:
            return f"expected a tuple, got {type(value).__name__}"
        if len(value) > self.max_len:
            return f"{len(value)} items, more than {self.max_len}"
        try:
            self._pack(value)
        except (TypeError, OverflowError):
            return "items must be integers in [0, 4294967295]"
        if any(type(v) is not int for v in value):
            return "items must be integers"
        return None


@dataclass(frozen=True, slots=True)
class F32Array(_PackedArray):
    """Float32 values (log-probs), each finite and in [lo, hi]."""

    lo: float = -math.inf
    hi: float = math.inf
    typecode = "f"
    itemsize = 4

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is a tuple of float32-exact floats in range."""
        if type(value) is not tuple:
            return f"expected a tuple, got {type(value).__name__}"
        if len(value) > self.max_len:
            return f"{len(value)} items, more than {self.max_len}"
        if any(type(v) is not float for v in value):
            return "items must be floats"
        if tuple(self._pack(value)) != value:
            return "items must be exactly representable as float32"
        return self._range_problem(value)

    def _range_problem(self, value: Sequence[float]) -> str | None:
        if value and not (
            all(map(math.isfinite, value)) and self.lo <= min(value) and max(value) <= self.hi
        ):
            bad = next(v for v in value if not (math.isfinite(v) and self.lo <= v <= self.hi))
            return f"item {bad} not finite or outside [{self.lo}, {self.hi}]"
        return None

    def _check_unpacked(self, arr: array) -> str | None:
        if len(arr) > self.max_len:
            return f"{len(arr)} items, more than {self.max_len}"
        return self._range_problem(arr)


@dataclass(frozen=True, slots=True)
class ListOf(Spec):
    """A tuple of `item`s, between `min_len` and `max_len` of them."""

    item: Spec
    max_len: int
    min_len: int = 0

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is a tuple of legal items of a legal count."""
        if type(value) is not tuple:
            return f"expected a tuple, got {type(value).__name__}"
        if not self.min_len <= len(value) <= self.max_len:
            return f"{len(value)} items, outside [{self.min_len}, {self.max_len}]"
        for i, v in enumerate(value):
            problem = self.item.check(v)
            if problem is not None:
                return f"item {i}: {problem}"
        return None

    def to_wire(self, value: tuple[Any, ...]) -> list[Any]:
        """The msgpack array of the items."""
        return [self.item.to_wire(v) for v in value]

    def from_wire(self, raw: Any, obj: str, field: str) -> tuple[Any, ...]:
        """The tuple of items of an unpacked array; `DecodeError` naming the bad item."""
        if type(raw) is not list:
            raise DecodeError(obj, field, f"expected an array, got {type(raw).__name__}")
        if not self.min_len <= len(raw) <= self.max_len:
            raise DecodeError(
                obj, field, f"{len(raw)} items, outside [{self.min_len}, {self.max_len}]"
            )
        return tuple(self.item.from_wire(v, obj, f"{field}[{i}]") for i, v in enumerate(raw))
