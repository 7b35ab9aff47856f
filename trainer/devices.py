"""Where a role's model computes (`--device`) and at which precision (the run's
`verification.precision`).

`resolve_device("auto")` is a CUDA GPU when torch sees one, else the CPU. Workers generate
at the run's precision (`precision_dtype`: fp32 → float32, bf16 → bfloat16), so that
audits, which judge at that precision only, pass their honest rollouts. `precision_problem`
says, in one line, why a device cannot compute at a precision (a GPU without bf16), so a
worker refuses to start instead of making rollouts that every audit would fail.
"""

from __future__ import annotations

from typing import Any

DEVICES = ("auto", "cpu", "cuda")
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class DeviceError(ValueError):
    """A device that is not here, or cannot compute at the run's precision; one line."""


def resolve_device(name: str) -> str:
    """`cpu` or `cuda` for a `--device` of `auto`, `cpu` or `cuda`; `DeviceError` for
    `cuda` on a machine where torch sees no GPU."""
    import torch  # deferred: heavy import

    if name not in DEVICES:
        raise DeviceError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    has_gpu = torch.cuda.is_available()
    if name == "auto":
        return "cuda" if has_gpu else "cpu"
    if name == "cuda" and not has_gpu:
        raise DeviceError("--device cuda: torch sees no CUDA GPU here (use --device cpu)")
    return name


def precision_dtype(precision: str) -> Any:
    """The torch dtype a worker computes in at the run's `verification.precision`."""
    import torch  # deferred: heavy import

    if precision not in PRECISION_DTYPES:
        raise DeviceError(
            f"precision must be one of {', '.join(PRECISION_DTYPES)}, got {precision!r}"
        )
    return getattr(torch, PRECISION_DTYPES[precision])


def precision_problem(device: str, precision: str) -> str | None:
    """Why `device` (`cpu` or `cuda`) cannot compute at `precision`, or None when it can.
    A CPU computes both (bf16 slowly without native support); a GPU computes bf16 from
    compute capability 8.0 on (torch's `is_bf16_supported` without emulation)."""
    import torch  # deferred: heavy import

    if precision not in PRECISION_DTYPES:
        return f"the run's precision {precision!r} is none of {', '.join(PRECISION_DTYPES)}"
    if device == "cuda" and precision == "bf16":
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name()
            return (
                f"the run's verification.precision is bf16 and this GPU ({name}) has no "
                "native bf16 (compute capability < 8.0): its rollouts would fail every audit"
            )
    return None
