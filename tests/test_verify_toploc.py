"""Spec-level vectors for the TOPLOC-compatible proof encoding (`verify.toploc`).

Reference digests were computed with `toploc` 0.1.6 (its C++ sources compiled against our
torch) via `toploc.build_proofs_bytes(list(x), 32, 128, skip_prefill=True)`; the hand
vectors are worked out on paper below.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verify import toploc
from verify.toploc import P, ProofFormatError


def _perm_acts(t: int, h: int) -> torch.Tensor:
    """Deterministic activations with distinct bf16 magnitudes (no top-k ties): an odd
    multiplier permutes 0..N-1, each value is +-2^(e/64)."""
    n = t * h
    big = 1
    while big < n:
        big *= 2
    perm = (torch.arange(n, dtype=torch.int64) * 7919 + 12345) % big
    sign = 1 - 2 * (perm % 2)
    v = sign.double() * torch.pow(2.0, (perm.double() - big / 2) / (big / 64))
    return v.reshape(t, h).to(torch.bfloat16)


def _forced(positions: list[int]) -> torch.Tensor:
    """[32, 2048] activations whose 128 largest |values| sit at `positions`."""
    x = torch.full((32 * 2048,), 2.0**-20, dtype=torch.float64)
    x[torch.arange(0, 32 * 2048, 3)] = -(2.0**-21)
    for r, i in enumerate(positions):
        x[i] = (1 - 2 * (r % 2)) * (1 + r / 128.0) * 4
    return x.reshape(32, 2048).to(torch.bfloat16)


def _digest(proofs: list[bytes]) -> str:
    return hashlib.sha256(b"".join(proofs)).hexdigest()


# ------------------------------------------------------------------ hand vectors


def test_hand_vector_two_points() -> None:
    # top-2 of |[1.0, -2.0, 0.5]|: pos 1 (-2.0 = 0xC000 = 49152), pos 0 (1.0 = 0x3F80 = 16256)
    # m = 65497 (0xFFD9); P(0) = 16256, P(1) = 49152 -> c0 = 16256, c1 = 32896 (0x8080)
    x = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.bfloat16)
    assert toploc.build_proofs_bytes(x, topk=2) == [bytes.fromhex("ffd93f808080")]


def test_hand_vector_three_points() -> None:
    # add P(2) = 0x3F00 = 16128. Newton: f[0,1] = 32896, f[1,2] = -33024,
    # f[0,1,2] = (-33024 - 32896) / 2 = -32960 = 32537 (mod p)
    # P(x) = 16256 + 32896 x + 32537 x (x - 1) = 16256 + 359 x + 32537 x^2
    x = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.bfloat16)
    assert toploc.build_proofs_bytes(x, topk=3) == [bytes.fromhex("ffd93f8001677f19")]


def test_big_endian_layout_and_size() -> None:
    proofs = toploc.build_proofs_bytes(_perm_acts(64, 64))
    assert [len(p) for p in proofs] == [258, 258]
    for p in proofs:
        m, coeffs = toploc.parse_proof(p)
        assert p[:2] == m.to_bytes(2, "big")
        assert p[2:4] == int(coeffs[0]).to_bytes(2, "big")
        assert np.array_equal(np.frombuffer(p, ">u2")[1:], coeffs)


# ------------------------------------------------------------------ reference vectors


@pytest.mark.parametrize(
    ("t", "h", "moduli", "digest"),
    [
        (
            64,
            64,
            [65497, 65497],
            "26bbe67a4b328cb8067d7564ddabf03711cb2bd4d1d15c3ea745d074419e2808",
        ),
        (
            40,
            100,
            [65497, 65497],
            "ab71bc16dcd4b0d686bf7c9d337def64ad66ea7f5decf6ce3ef7c5b685f6069a",
        ),
        (3, 896, [65497], "c5e3e23a71142080e0b7cea542ef8372e01f582d9cac338fdbe909e9774a1d35"),
    ],
)
def test_reference_digests(t: int, h: int, moduli: list[int], digest: str) -> None:
    proofs = toploc.build_proofs_bytes(_perm_acts(t, h))
    assert [int.from_bytes(p[:2], "big") for p in proofs] == moduli
    assert _digest(proofs) == digest


def test_modulus_search_reaches_65496() -> None:
    # positions 0 and 65497 collide mod 65497 only
    pos = [0, 65497, *range(2, 128)]
    proofs = toploc.build_proofs_bytes(_forced(pos))
    assert int.from_bytes(proofs[0][:2], "big") == 65496
    assert _digest(proofs) == "86054436d8c2a081a1cca1ccb10f4721e5748f7fbf9e6e10620172ea6e47f1d5"


def test_modulus_search_reaches_65495() -> None:
    # 0/65497 collide mod 65497, 10/65506 collide mod 65496
    pos = [0, 65497, 10, 65506, *range(20, 144)]
    proofs = toploc.build_proofs_bytes(_forced(pos))
    assert int.from_bytes(proofs[0][:2], "big") == 65495
    assert _digest(proofs) == "3e71e85376b4e45ce59d00a38b72cf0f67f10f96048bd7e2e1bb37479660cbf2"
    assert toploc.verify_proofs_bytes(_forced(pos), proofs)[0].exp_mismatches == 0


def test_injective_moduli_matches_naive_search() -> None:
    rng = np.random.default_rng(0)
    rows = np.stack([rng.choice(200_000, size=128, replace=False) for _ in range(20)])
    got = toploc.injective_moduli(rows)
    for row, m in zip(rows, got, strict=True):
        naive = next(i for i in range(P, 0, -1) if len({int(v) % i for v in row}) == 128)
        assert m == naive


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_interpolation_passes_through_points(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    xs = data.draw(st.lists(st.integers(0, P - 1), min_size=n, max_size=n, unique=True))
    ys = data.draw(st.lists(st.integers(0, 65535), min_size=n, max_size=n))
    coeffs = toploc.interpolate(np.array([xs]), np.array([ys]))
    assert np.array_equal(toploc.evaluate(coeffs, np.array([xs]))[0], np.array(ys) % P)


def _lagrange_coefficients(xs: list[int], ys: list[int]) -> list[int]:
    """The interpolating polynomial's coefficients with Python integers (no overflow)."""
    n = len(xs)
    out = [0] * n
    for i in range(n):
        basis, denom = [1], 1
        for j in range(n):
            if j != i:
                basis = [
                    ((basis[t - 1] if t else 0) - xs[j] * (basis[t] if t < len(basis) else 0)) % P
                    for t in range(len(basis) + 1)
                ]
                denom = denom * (xs[i] - xs[j]) % P
        scale = ys[i] % P * pow(denom, P - 2, P) % P
        out = [(o + scale * b) % P for o, b in zip(out, basis, strict=True)]
    return out


def test_interpolation_is_exact_at_the_edges_of_the_field() -> None:
    # the largest operands the fixed-width arithmetic meets: points and values near p and 2^16
    xs = [P - 1 - i for i in range(64)] + list(range(64))
    ys = [65535 - (i % 3) for i in range(128)]
    coeffs = toploc.interpolate(np.array([xs]), np.array([ys]))
    assert coeffs.tolist()[0] == _lagrange_coefficients(xs, ys)
    assert np.array_equal(toploc.evaluate(coeffs, np.array([xs]))[0], np.array(ys) % P)
    assert (
        toploc.evaluate(np.array([[P - 1] * 128]), np.array([[P - 1]]))[0, 0]
        == sum((P - 1) * pow(P - 1, e, P) for e in range(128)) % P
    )


# ------------------------------------------------------------------ chunks and edges


def test_short_last_chunk_gets_a_full_proof() -> None:
    x = torch.randn(70, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x)
    assert len(proofs) == 3 and all(len(p) == 258 for p in proofs)
    # the last chunk is 6 rows: its proof is the proof of those rows alone
    assert proofs[2] == toploc.build_proofs_bytes(x[64:])[0]
    assert all(r.exp_mismatches == 0 for r in toploc.verify_proofs_bytes(x, proofs))


def test_fewer_values_than_k_pads_with_zero_coefficients() -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    (proof,) = toploc.build_proofs_bytes(x)  # 24 values < 128
    m, coeffs = toploc.parse_proof(proof)
    assert m == P and len(proof) == 258
    assert not coeffs[24:].any() and coeffs[:24].any()
    (res,) = toploc.verify_proofs_bytes(x, [proof])
    assert (res.exp_mismatches, res.mant_err_mean, res.sign_mismatches, res.points) == (
        0,
        0.0,
        0,
        24,
    )


def test_empty_activations_give_no_proofs() -> None:
    assert toploc.build_proofs_bytes(torch.zeros(0, 8, dtype=torch.bfloat16)) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_activations_are_refused(bad: float) -> None:
    x = torch.randn(40, 8).to(torch.bfloat16)
    x[5, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        toploc.build_proofs_bytes(x)
    with pytest.raises(ValueError, match="NaN or inf"):
        toploc.verify_proofs_bytes(x, [bytes(258), bytes(258)])


def test_float32_input_is_rounded_to_bf16_first() -> None:
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(3))
    assert toploc.build_proofs_bytes(x) == toploc.build_proofs_bytes(x.to(torch.bfloat16))


# ------------------------------------------------------------------ verification


def test_verification_statistics_on_tampering() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x)
    honest = toploc.verify_proofs_bytes(x, proofs)
    assert all(r.as_tuple() == (0, 0.0, 0.0) and r.sign_mismatches == 0 for r in honest)
    other = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert all(r.exp_mismatches > 64 for r in toploc.verify_proofs_bytes(other, proofs))
    # a negated hidden state keeps every magnitude: TOPLOC's statistics pass, ours do not
    flipped = toploc.verify_proofs_bytes(-x, proofs)
    assert all(r.as_tuple() == (0, 0.0, 0.0) and r.sign_mismatches == 128 for r in flipped)


def test_mantissa_statistics_follow_the_reference_definition() -> None:
    # one value's mantissa off by 3, another's exponent off: mean over matching exponents,
    # upper median
    x = torch.tensor([[4.0, 2.0, 1.0, -8.0]], dtype=torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x, topk=4)
    y = x.clone()
    y.view(torch.int16)[0, 0] += 3  # 4.0 -> mantissa 3
    y[0, 3] = -16.0  # exponent + 1 (still the largest, so the same top-4 set)
    (r,) = toploc.verify_proofs_bytes(y, proofs, topk=4)
    assert r.exp_mismatches == 1
    assert r.mant_err_mean == pytest.approx(1.0)  # errors [3, 0, 0]
    assert r.mant_err_median == 0.0


def test_no_matching_exponent_reports_2_pow_64() -> None:
    x = torch.tensor([[4.0, 2.0]], dtype=torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x, topk=2)
    (r,) = toploc.verify_proofs_bytes(x * 4, proofs, topk=2)
    assert r.as_tuple() == (2, 2.0**64, 2.0**64)


@pytest.mark.parametrize(
    ("proof", "message"),
    [
        (b"", "0 bytes"),
        (bytes(257), "257 bytes"),
        (bytes(258), "modulus 0"),  # the reference's silent null proof
        (b"\xff\xff" + bytes(256), "modulus 65535"),
        (b"\x00\x05" + bytes(256), "cannot be injective"),
        (b"\xff\xd9" + b"\xff\xda" + bytes(254), "coefficient"),
    ],
)
def test_malformed_proofs_raise(proof: bytes, message: str) -> None:
    x = torch.randn(32, 16).to(torch.bfloat16)
    with pytest.raises(ProofFormatError, match=message):
        toploc.verify_proofs_bytes(x, [proof])


def test_wrong_number_of_proofs_raises() -> None:
    x = torch.randn(33, 16).to(torch.bfloat16)
    proofs = toploc.build_proofs_bytes(x)
    with pytest.raises(ProofFormatError, match="1 proofs for 2 chunks"):
        toploc.verify_proofs_bytes(x, proofs[:1])
    with pytest.raises(ProofFormatError, match="not bytes"):
        toploc.verify_proofs_bytes(x, [proofs[0], "text"])  # type: ignore[list-item]


def test_null_proof_detection() -> None:
    assert toploc.is_null_proof(bytes(258))
    assert not toploc.is_null_proof(b"")
    assert not toploc.is_null_proof(b"\x00\x01" + bytes(256))


# ------------------------------------------------------------------ optional: the reference


def _reference_library() -> Any:
    """The reference `toploc` package; skipped where it is absent or its compiled parts do not
    load (its PyPI wheel is built against another torch), a failure in CI, which builds it."""
    try:
        return importlib.import_module("toploc")
    except ImportError as exc:
        reason = (
            f"the reference toploc 0.1.6 does not import ({exc}); build it against this torch: "
            "pip install --no-build-isolation --no-binary toploc toploc==0.1.6"
        )
    if os.environ.get("SWARM_CI") == "1":
        pytest.fail(f"CI builds the reference library: {reason}")
    pytest.skip(reason)


def test_byte_identical_with_reference_library() -> None:
    ref = _reference_library()
    gen = torch.Generator().manual_seed(6)
    for t, h in [(32, 64), (100, 96), (33, 4096)]:
        x = torch.randn(t, h, generator=gen).to(torch.bfloat16)
        mine = toploc.build_proofs_bytes(x)
        theirs = ref.build_proofs_bytes(list(x), 32, 128, skip_prefill=True)
        assert mine == theirs
        y = (x.float() * 1.01).to(torch.bfloat16)
        a = [r.as_tuple() for r in toploc.verify_proofs_bytes(y, theirs)]
        b = [
            (r.exp_mismatches, r.mant_err_mean, r.mant_err_median)
            for r in ref.verify_proofs_bytes(y, mine, 32, 128, skip_prefill=True)
        ]
        assert a == [(v[0], float(v[1]), float(v[2])) for v in b]


def test_many_equals_one_by_one() -> None:
    gen = torch.Generator().manual_seed(7)
    acts = [torch.randn(t, 48, generator=gen).to(torch.bfloat16) for t in (5, 32, 70, 1, 33)]
    many = toploc.build_proofs_bytes_many(acts)
    assert many == [toploc.build_proofs_bytes(a) for a in acts]
    noisy = [(a.float() * 1.02).to(torch.bfloat16) for a in acts]
    assert toploc.verify_proofs_bytes_many(noisy, many) == [
        toploc.verify_proofs_bytes(a, p) for a, p in zip(noisy, many, strict=True)
    ]
    with pytest.raises(ProofFormatError):
        toploc.verify_proofs_bytes_many(acts, [many[0]] * len(acts))
