"""Canonical msgpack encoding of the wire objects, and the strict decoder.

An object `X(a, b, c)` of schema version s is the msgpack array `[s, a, b, c]`, fields in
declaration order. A field declared `spec(..., default=d, omit_default=True)` must come after
every other field; it is left off the end of the array while it (and every such field after
it) equals its default, so adding one keeps the bytes of every object that leaves it at its
default. The decoder fills a left-off field with its default; an encoded default is
non-canonical. There is exactly one encoding of each value (msgpack's shortest forms,
float64 for floats, bin for bytes, str for text), and the decoder enforces it by re-encoding
what it read and comparing bytes: so a signature over the canonical bytes covers every bit
a peer can send, and no mutation decodes to an equal object.

Decoder invariant (tested by the fuzzer in `swarm_node_bench.codec` and in tests): for any input
bytes, `decode(cls, data)` either returns a valid `cls` or raises `DecodeError`. Nothing
else escapes. The size limit of the object kind is checked before msgpack sees a byte.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import msgpack

from protocol.errors import DecodeError, LocalProtocolError, OversizeError
from protocol.schema import Spec

T = TypeVar("T", bound="WireObject")


def spec(s: Spec, *, omit_default: bool = False, **kwargs: Any) -> Any:
    """Declare a dataclass field with its wire type: `top_k: int = spec(Int(*U32))`.

    `omit_default=True` (with a `default`, after every other field): the field is encoded
    only when it differs from its default (see the module docstring)."""
    if omit_default and "default" not in kwargs:
        raise TypeError("omit_default needs a default")
    return dataclasses.field(metadata={"spec": s, "omit_default": omit_default}, **kwargs)


class WireObject:
    """Base of the frozen wire dataclasses. Subclasses set the three class constants.

    Built objects validate themselves (`LocalProtocolError` on a bad value), so a wire
    object that exists is legal, whichever side made it.
    """

    __slots__ = ()

    KIND: ClassVar[str]
    SCHEMA: ClassVar[int]
    MAX_BYTES: ClassVar[int]
    _FIELDS: ClassVar[tuple[tuple[str, Spec], ...]]
    _TAIL: ClassVar[tuple[tuple[str, Any], ...]]

    def __post_init__(self) -> None:
        for name, s in self.wire_fields():
            problem = s.check(getattr(self, name))
            if problem is not None:
                raise LocalProtocolError(f"{type(self).__name__}.{name}: {problem}")

    @classmethod
    def wire_fields(cls) -> tuple[tuple[str, Spec], ...]:
        """(name, spec) of each field in declaration order, the wire order (cached)."""
        fields = cls.__dict__.get("_FIELDS")
        if fields is None:
            fields = tuple((f.name, f.metadata["spec"]) for f in dataclasses.fields(cast(Any, cls)))
            cls._FIELDS = fields
        return fields

    @classmethod
    def omitted_tail(cls) -> tuple[tuple[str, Any], ...]:
        """(name, default) of the trailing fields left off the wire at their default."""
        return cls.__dict__.get("_TAIL", ())


def wire(kind: str, schema: int, max_bytes: int) -> Any:
    """Class decorator: a frozen, slotted dataclass registered as wire object `kind`."""

    def wrap(cls: type) -> type:
        cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
        cls.KIND = kind
        cls.SCHEMA = schema
        cls.MAX_BYTES = max_bytes
        tail: list[tuple[str, Any]] = []
        for f in dataclasses.fields(cls):
            if not isinstance(f.metadata.get("spec"), Spec):
                raise TypeError(f"{cls.__name__}.{f.name} has no wire spec")
            if f.metadata.get("omit_default"):
                tail.append((f.name, f.default))
            elif tail:
                raise TypeError(f"{cls.__name__}.{f.name} follows a field left off at default")
        cls._TAIL = tuple(tail)
        if kind in REGISTRY:
            raise TypeError(f"wire kind {kind!r} registered twice")
        REGISTRY[kind] = cls
        return cls

    return wrap


REGISTRY: dict[str, type] = {}


def pack(value: Any) -> bytes:
    """msgpack's bytes of `value`, bin for bytes and str for text (the canonical forms)."""
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def to_wire(obj: WireObject) -> list[Any]:
    """The msgpack-ready array of an object (schema version first)."""
    fields = obj.wire_fields()
    n = len(fields)
    for name, default in reversed(obj.omitted_tail()):
        if getattr(obj, name) != default:
            break
        n -= 1
    out: list[Any] = [obj.SCHEMA]
    for name, s in fields[:n]:
        out.append(s.to_wire(getattr(obj, name)))
    return out


def from_wire(cls: type[T], raw: Any, where: str | None = None) -> T:
    """Build `cls` from an unpacked msgpack value, validating every field."""
    name = where or cls.__name__
    if type(raw) is not list:
        raise DecodeError(name, None, f"expected an array, got {type(raw).__name__}")
    fields = cls.wire_fields()
    if not raw:
        raise DecodeError(name, None, "empty array (no schema version)")
    if raw[0] != cls.SCHEMA or type(raw[0]) is not int:
        raise DecodeError(name, None, f"unknown schema version {raw[0]!r} (expected {cls.SCHEMA})")
    tail = cls.omitted_tail()
    if not len(fields) - len(tail) + 1 <= len(raw) <= len(fields) + 1:
        if len(raw) < len(fields) + 1:
            missing = ", ".join(n for n, _ in fields[len(raw) - 1 : len(fields) - len(tail)])
            raise DecodeError(name, None, f"missing fields: {missing}")
        raise DecodeError(name, None, f"{len(raw) - 1 - len(fields)} extra field(s)")
    obj = object.__new__(cls)
    for (field, s), value in zip(fields, raw[1:], strict=False):
        object.__setattr__(obj, field, s.from_wire(value, name, field))
    left_off = len(fields) + 1 - len(raw)  # trailing fields at their default
    for field, default in tail[len(tail) - left_off :]:
        object.__setattr__(obj, field, default)
    return obj


@dataclass(frozen=True, slots=True)
class Nested(Spec):
    """Another wire dataclass, encoded in place as its own array (schema version first)."""

    cls: type

    def check(self, value: Any) -> str | None:
        """A problem string unless `value` is an instance of exactly `cls`."""
        if type(value) is not self.cls:
            return f"expected {self.cls.__name__}, got {type(value).__name__}"
        return None  # a built wire object validated itself

    def to_wire(self, value: Any) -> list[Any]:
        """The nested object's msgpack-ready array."""
        return to_wire(value)

    def from_wire(self, raw: Any, obj: str, field: str) -> Any:
        """Build the nested object, naming its place (`obj.field`) in any error."""
        return from_wire(self.cls, raw, where=f"{obj}.{field}")


def encode(obj: WireObject) -> bytes:
    """The canonical bytes of a wire object."""
    data = pack(to_wire(obj))
    if len(data) > obj.MAX_BYTES:
        raise LocalProtocolError(
            f"{type(obj).__name__} encodes to {len(data)} bytes, over its limit {obj.MAX_BYTES}"
        )
    return data


def _unpack(name: str, data: bytes, limit: int) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            timestamp=0,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, ...)
        raise DecodeError(
            name, None, f"not a msgpack value ({type(exc).__name__}: {exc})"
        ) from None


def decode(cls: type[T], data: bytes | bytearray | memoryview) -> T:
    """Decode canonical bytes of `cls`. Raises `DecodeError` (and only that) on bad input."""
    name = cls.__name__
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(name, None, f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > cls.MAX_BYTES:
        raise OversizeError(name, None, f"{len(data)} bytes, over the limit of {cls.MAX_BYTES}")
    obj = from_wire(cls, _unpack(name, data, cls.MAX_BYTES))
    if pack(to_wire(obj)) != data:
        raise DecodeError(name, None, "non-canonical encoding")
    return obj
