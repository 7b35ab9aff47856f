"""What a role or a command loads from this machine before it works: the run's datasets
checked, the generation engine opened, the audit limits of the model's calibration file.

The work is `trainer.tasks`, `trainer.engines` and `verify.calibration`'s; this module
reads the files and turns their errors into the CLI's one-line `CommandError`, naming
what to fix. Used by `swarm-node rollouts`, `audit` and `start` (through the roles).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.errors import CommandError
from trainer.devices import DeviceError, precision_problem, resolve_device
from trainer.engines import EngineError, open_engine
from trainer.tasks import TaskError, resolve_dataset
from verify.calibration import FILE_NAME, CalibrationError, apply, decode_calibration


def check_datasets(manifest: Any, source: str) -> None:
    """Every dataset the run manifest names can be used here (`source` names the file)."""
    for i, d in enumerate(manifest.datasets):
        try:
            resolve_dataset(d.name)
        except TaskError as exc:
            raise CommandError(f"{source}: datasets[{i}]: {exc}") from None


def load_engine(
    path: Path,
    *,
    batch_size: int,
    threads: int | None,
    engine: str = "hf",
    device: str = "cpu",
    precision: str = "fp32",
) -> Any:
    """`trainer.engines.open_engine`: `hf` (transformers, on `device`) or `vllm` (vLLM's
    CPU build or a GPU), computing at the run's `precision`."""
    try:
        return open_engine(
            path,
            batch_size=batch_size,
            threads=threads,
            engine=engine,
            device=device,
            precision=precision,
        )
    except EngineError as exc:
        raise CommandError(str(exc)) from None


def check_device(device: str, precision: str) -> str:
    """`--device` resolved (`cpu` or `cuda`), checked able to compute at the run's
    `precision`; a one-line `CommandError` otherwise (before the node joins, so a worker
    that cannot meet the precision is never banned for rollouts that fail their audits)."""
    try:
        where = resolve_device(device)
    except DeviceError as exc:
        raise CommandError(str(exc)) from None
    problem = precision_problem(where, precision)
    if problem is not None:
        raise CommandError(f"--device {device}: {problem}")
    return where


def load_calibration(
    model_dir: str | Path | None, settings: Any, manifest: Any = None
) -> tuple[Any, str]:
    """`settings` with the limits of `model_dir/calibration.json` for their precision, and a
    note for the user. A manifest that pins a digest needs that very file; without a pin
    and without a file the shipped defaults apply (the note says so)."""
    pin = getattr(manifest, "calibration_digest", b"") if manifest is not None else b""
    path = Path(model_dir) / FILE_NAME if model_dir is not None else None
    if path is None or not path.is_file():
        if pin:
            raise CommandError(
                f"the run pins calibration {pin.hex()[:16]}... but {path or 'the model'} has no {FILE_NAME}: "
                "run `swarm-node calibrate --model DIR`"
            )
        return (
            settings,
            f"no {FILE_NAME} next to the model: shipped default limits (run `swarm-node calibrate`)",
        )
    try:
        cal = decode_calibration(path.read_bytes(), pin)
        return apply(settings, cal), f"calibration {cal.digest.hex()[:16]} ({path})"
    except (OSError, CalibrationError) as exc:
        raise CommandError(f"{path}: {exc}") from None
