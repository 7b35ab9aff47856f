"""Field types the stream protocols need beyond `protocol.schema`'s, in its `Spec` shape.

`protocol.schema` describes the fields of wire dataclasses; a request or response of a
stream protocol is a bare msgpack value (a fixed-arity array, a nullable field, one of
several request forms), so these compose the same `Spec`s into those shapes. Like the
rest of `protocol.schema`: no coercion beyond what each type says, every length capped,
`from_wire` raises `DecodeError` naming the message and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from protocol.errors import DecodeError
from protocol.schema import Spec


@dataclass(frozen=True, slots=True)
class Number(Spec):
    """A finite int or float (not a bool); read back as a float."""

    def check(self, value: Any) -> str | None:
        if type(value) not in (int, float):
            return f"expected a number, got {type(value).__name__}"
        if not math.isfinite(value):
            return f"{value} is not finite"
        return None

    def from_wire(self, raw: Any, obj: str, field: str) -> float:
        problem = self.check(raw)
        if problem is not None:
            raise DecodeError(obj, field, problem)
        return float(raw)


@dataclass(frozen=True, slots=True)
class Nullable(Spec):
    """`inner`, or nil."""

    inner: Spec

    def check(self, value: Any) -> str | None:
        return None if value is None else self.inner.check(value)

    def to_wire(self, value: Any) -> Any:
        return None if value is None else self.inner.to_wire(value)

    def from_wire(self, raw: Any, obj: str, field: str) -> Any:
        return None if raw is None else self.inner.from_wire(raw, obj, field)


@dataclass(frozen=True, slots=True)
class Const(Spec):
    """Exactly one string (a request's verb)."""

    value: str

    def check(self, value: Any) -> str | None:
        if value != self.value or type(value) is not str:
            return f"expected {self.value!r}"
        return None


@dataclass(frozen=True, slots=True)
class Fields(Spec):
    """A fixed-arity msgpack array, one `Spec` per position; read back as a tuple."""

    items: tuple[Spec, ...]

    def check(self, value: Any) -> str | None:
        if type(value) not in (tuple, list):
            return f"expected an array, got {type(value).__name__}"
        if len(value) != len(self.items):
            return f"{len(value)} items, expected {len(self.items)}"
        for i, (spec, v) in enumerate(zip(self.items, value, strict=True)):
            problem = spec.check(v)
            if problem is not None:
                return f"item {i}: {problem}"
        return None

    def to_wire(self, value: Any) -> list[Any]:
        return [spec.to_wire(v) for spec, v in zip(self.items, value, strict=True)]

    def from_wire(self, raw: Any, obj: str, field: str) -> tuple[Any, ...]:
        if type(raw) is not list:
            raise DecodeError(obj, field, f"expected an array, got {type(raw).__name__}")
        if len(raw) != len(self.items):
            raise DecodeError(obj, field, f"{len(raw)} items, expected {len(self.items)}")
        return tuple(
            spec.from_wire(v, obj, f"{field}[{i}]")
            for i, (spec, v) in enumerate(zip(self.items, raw, strict=True))
        )


@dataclass(frozen=True, slots=True)
class OneOf(Spec):
    """The first of `options` that reads the value (a request with several forms)."""

    options: tuple[Spec, ...]
    what: str

    def check(self, value: Any) -> str | None:
        if all(o.check(value) is not None for o in self.options):
            return f"not {self.what}"
        return None

    def to_wire(self, value: Any) -> Any:
        for o in self.options:
            if o.check(value) is None:
                return o.to_wire(value)
        return value

    def from_wire(self, raw: Any, obj: str, field: str) -> Any:
        for o in self.options:
            try:
                return o.from_wire(raw, obj, field)
            except DecodeError:
                continue
        raise DecodeError(obj, field, f"not {self.what}")
