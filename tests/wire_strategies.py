"""Hypothesis strategies derived from the wire specs, so every object and field is covered."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from protocol.codec import Nested
from protocol.identity import PEER_ID_PREFIX
from protocol.schema import (
    Bool,
    Bytes,
    F32Array,
    Float,
    Int,
    ListOf,
    PeerId,
    Spec,
    Str,
    U32Array,
)


def for_spec(s: Spec) -> st.SearchStrategy:
    if isinstance(s, Int):
        return st.integers(s.lo, s.hi)
    if isinstance(s, Float):
        return st.floats(s.lo, s.hi, allow_nan=False, allow_infinity=False)
    if isinstance(s, Bool):
        return st.booleans()
    if isinstance(s, Str):
        if s.choices is not None:
            return st.sampled_from(s.choices)
        alphabet = st.sampled_from(s.charset) if s.charset else st.characters(codec="utf-8")
        return st.text(alphabet, min_size=s.min_len, max_size=min(s.max_len, 24))
    if isinstance(s, Bytes):
        if s.sizes is not None:
            return st.sampled_from(s.sizes).flatmap(lambda n: st.binary(min_size=n, max_size=n))
        return st.binary(min_size=s.min_len, max_size=min(s.max_len, 64))
    if isinstance(s, PeerId):
        return st.binary(min_size=32, max_size=32).map(lambda k: PEER_ID_PREFIX + k)
    if isinstance(s, U32Array):
        return st.lists(st.integers(0, 2**32 - 1), max_size=min(s.max_len, 40)).map(tuple)
    if isinstance(s, F32Array):
        return st.lists(
            st.floats(s.lo, s.hi, width=32, allow_nan=False, allow_infinity=False),
            max_size=min(s.max_len, 40),
        ).map(tuple)
    if isinstance(s, ListOf):
        return st.lists(for_spec(s.item), min_size=s.min_len, max_size=min(s.max_len, 4)).map(tuple)
    if isinstance(s, Nested):
        return for_class(s.cls)
    raise TypeError(f"no strategy for {s!r}")


def for_class(cls: type) -> st.SearchStrategy:
    return st.builds(cls, **{f.name: for_spec(f.metadata["spec"]) for f in dataclasses.fields(cls)})
