"""Calibration files: the audit limits measured for one model, as bytes with a content id.

What lives here: the file format and its digest, and turning a file into audit limits.
Measuring (generating honest rollouts under each variation) and writing the file is
`swarm-node calibrate` (`node/commands/calibrate.py`); reading it next to a model, with the
run's pin, is `node.local_model.load_calibration`.

A calibration file (`calibration.json`, written next to the model) is canonical JSON:

    {"format": 1,
     "model": "<what was calibrated, for people>",
     "regimes": {"fp32": {<Thresholds fields>}, "bf16": {...}},
     "measured": {"fp32": {"rollouts": N, "variations": [...], "max": {metric: value}}, ...}}

`regimes` holds the limits of each compute precision a run may fix (a run's audit uses only
its own precision's, see `verify.auditor`); `measured` is the data behind them (the
largest honest value of each metric), so anyone can check how the limits were drawn. The
run manifest pins the file's content id (`verification.calibration_digest`): every
validator of a run judges with the same limits, and a changed file is refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from protocol.content_id import content_id
from verify.thresholds import BF16_FLOOR, STRICT, STRICT_FLOOR, THRESHOLDS, Thresholds

FILE_NAME = "calibration.json"
FORMAT = 1
MAX_BYTES = 1 << 20


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A decoded calibration file: limits per precision, the data behind them, its digest."""

    regimes: dict[str, Thresholds]
    measured: dict[str, Any]
    model: str
    digest: bytes


def encode_calibration(
    regimes: dict[str, Thresholds], measured: dict[str, Any], model: str
) -> bytes:
    """The canonical bytes of a calibration file (sorted keys, no spaces, newline)."""
    doc = {
        "format": FORMAT,
        "model": model,
        "regimes": {p: asdict(th) for p, th in sorted(regimes.items())},
        "measured": measured,
    }
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def calibration_digest(data: bytes) -> bytes:
    """The content id of a calibration file's bytes (what a run manifest pins)."""
    return content_id(data)


def decode_calibration(data: bytes, expect_digest: bytes = b"") -> Calibration:
    """Parse a calibration file; `expect_digest` (the manifest's pin, b"" = none) must match."""
    digest = calibration_digest(data)
    if expect_digest and digest != expect_digest:
        raise CalibrationError(
            f"calibration digest {digest.hex()[:16]}... is not the run's {expect_digest.hex()[:16]}..."
        )
    if len(data) > MAX_BYTES:
        raise CalibrationError(f"calibration file of {len(data)} bytes (at most {MAX_BYTES})")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"calibration file is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CalibrationError(f"calibration file: expected format {FORMAT}")
    names = {f.name for f in fields(Thresholds)}
    regimes: dict[str, Thresholds] = {}
    raw = doc.get("regimes")
    if not isinstance(raw, dict) or not raw:
        raise CalibrationError("calibration file: no regimes")
    for precision, limits in raw.items():
        if not isinstance(limits, dict) or set(limits) - names:
            raise CalibrationError(f"calibration file: regimes.{precision}: unknown limits")
        for k, v in limits.items():
            if type(v) not in (int, float) or not v >= 0:
                raise CalibrationError(
                    f"calibration file: regimes.{precision}.{k}: expected a number >= 0"
                )
        # A limit added after the file was written takes its regime's default.
        default = STRICT if precision == "fp32" else THRESHOLDS
        regimes[str(precision)] = replace(default, **limits)
    measured = doc.get("measured") or {}
    for precision, th in regimes.items():
        if "producer_logprob_err_median" not in raw[precision]:
            regimes[precision] = replace(
                th, producer_logprob_err_median=_producer_limit(precision, measured, th)
            )
    return Calibration(regimes, measured, str(doc.get("model", "")), digest)


def _producer_limit(precision: str, measured: Any, th: Thresholds) -> float:
    """The producer median's limit of a file written before it existed: what `calibrate`
    sets (the largest honest `logprob_err_mean`, at least the floor) from the file's own
    measurements, else the regime's default."""
    floor = STRICT_FLOOR if precision == "fp32" else BF16_FLOOR
    try:
        value = measured[precision]["max"]["logprob_err_mean"]
    except (KeyError, TypeError):
        return th.producer_logprob_err_median
    if type(value) not in (int, float) or not value >= 0:
        return th.producer_logprob_err_median
    return max(floor.producer_logprob_err_median, float(value))


def apply(settings: Any, cal: Calibration) -> Any:
    """`settings` (an `AuditSettings`) with the calibration's limits for its precision;
    raises `CalibrationError` when the file has none for that precision."""
    th = cal.regimes.get(settings.precision)
    if th is None:
        raise CalibrationError(
            f"the calibration has no limits for precision {settings.precision} "
            f"(has {', '.join(sorted(cal.regimes))}): recalibrate with `swarm-node calibrate`"
        )
    if settings.precision == "bf16":
        return replace(settings, bf16_thresholds=th)
    return replace(settings, thresholds=th)
