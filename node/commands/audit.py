"""`swarm-node audit FILE... [--model DIR] [--run RUN.toml | --precision P] [--data-dir D] [--json]`.

Reads rollout record files (msgpack streams, `protocol.rollout.read_records`), opens each
record (signature, body digest), audits them all against the model with one batched
prefill (`verify.audit_records`) and prints one line per rollout, or one JSON object per
line with `--json`. With a run manifest the task is re-derived and the reward re-scored
(`trainer.judge.make_judge`), and the sampling and proof settings are the run's; without one those
checks are skipped (said once on stderr). The run states the workers' compute precision
and the audit judges at it only; without a manifest `--precision` says it (default fp32).
The limits are the model's calibration file (`DIR/calibration.json`, `swarm-node
calibrate`), the very file whose digest the run pins when it pins one; without a file and
without a pin, the shipped defaults of `verify.thresholds` (said on stderr).
Versions: each record is audited against the weights of the policy version it claims.
`--model` holds version `--model-version` (default 0); `--versions DIR` adds one model
directory per version (`DIR/<version>`). A claimed version not held fails
`unknown-version`, never a pass.

Exit status: 0 when every rollout passed, 1 when any failed, 2 on usage and IO errors
(missing or unreadable file, an unusable model directory or manifest). A record that
cannot be opened (`bad-record`) and every stream problem count as failed items with their
own line and reason, and the other records of the file are still audited:
`stream-empty` (an empty file), `stream-truncated` (the file ends inside a record),
`stream-garbage` (bytes that are not a record; the rest of that file cannot be read),
`record-too-large` (over `RolloutRecord.MAX_BYTES`, skipped unread). Per record, the
audit enforces `AuditSettings.max_record_tokens` (reason `too-large`, before any prefill).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.errors import CommandError
from node.local_model import load_calibration
from node.paths import resolve_model
from node.run_file import load_run_manifest
from protocol.errors import RemoteProtocolError
from protocol.rollout import open_record, scan_records
from protocol.wire import WORKER_PRECISIONS as PRECISIONS
from trainer.model_dir import ModelDirError, load_model_dir

# One item of the input files: (file, index, record bytes or None, problem, detail)
Item = tuple[str, int, bytes | None, str, str]


def _load_records(files: Sequence[Path]) -> list[Item]:
    """(file, index, record bytes or None, problem, detail) for every item of every file:
    a stream problem (`protocol.rollout.scan_records`) is an item of its own that fails,
    and the records around it are still audited."""
    out = []
    for path in files:
        try:
            with open(path, "rb") as f:
                for item in scan_records(f):
                    out.append((str(path), item.index, item.record, item.problem, item.detail))
        except FileNotFoundError:
            raise CommandError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise CommandError(f"{path}: is a directory") from None
        except OSError as exc:
            raise CommandError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return out


def _load_model(model_dir: str, data_dir: str | None) -> tuple[Any, Any, Path]:
    path = resolve_model(model_dir, model_dir, data_dir)
    try:
        return (*load_model_dir(path), Path(path))
    except ModelDirError as exc:
        raise CommandError(str(exc)) from None


def _version_models(
    lm: Any, model_version: int, versions: str | Path | None
) -> Callable[[int], Any]:
    """`model_for(version)`: `--model` holds `model_version`; `--versions DIR` holds one model
    directory per version, named by its number (`DIR/3`), loaded when a record claims it.
    Any other version is not held (the record fails `unknown-version`)."""
    if not 0 <= model_version < 2**32:
        raise CommandError(f"--model-version must be in [0, 2^32), got {model_version}")
    root = Path(versions) if versions is not None else None
    if root is not None and not root.is_dir():
        raise CommandError(f"--versions {root}: not a directory")
    cache: dict[int, Any] = {model_version: lm}

    def model_for(version: int) -> Any:
        if version in cache:
            return cache[version]
        path = root / str(version) if root is not None else None
        if path is None or not path.is_dir():
            return None
        try:
            cache[version] = load_model_dir(path)[0]
        except ModelDirError as exc:
            raise CommandError(str(exc)) from None
        return cache[version]

    return model_for


def main(
    files: Sequence[str | Path],
    model: str,
    as_json: bool = False,
    manifest: str | Path | None = None,
    out: Any = None,
    data_dir: str | None = None,
    precision: str | None = None,
    model_version: int = 0,
    versions: str | Path | None = None,
) -> int:
    """Run the audit; returns the exit status (0 all passed, 1 any failed). Usage and IO
    problems raise `CommandError` (exit status 2), found before the heavy imports."""
    out = out or sys.stdout
    precision = _precision(precision, manifest)
    if not files:
        raise CommandError("audit needs at least one record file")
    records = _load_records([Path(f) for f in files])
    run = None
    if manifest is not None:
        run = load_run_manifest(Path(manifest))
    lm, tokenizer, model_path = _load_model(model, data_dir)
    settings, judge = _settings(run, precision, tokenizer, model_path)
    opened, lines = _open_records(records)
    model_for = _version_models(lm, model_version, versions)
    from verify.auditor import audit_versions  # deferred: heavy import

    results = audit_versions([ro for _, ro in opened], model_for, judge=judge, settings=settings)
    for (k, ro), res in zip(opened, results, strict=True):
        lines[k] = _result_line(records[k], ro, res)
    failed = _write_lines(lines, as_json, out)
    if not as_json:
        print(f"swarm-node audit: {len(lines) - failed}/{len(lines)} passed", file=sys.stderr)
    return 1 if failed else 0


def _precision(precision: str | None, manifest: str | Path | None) -> str:
    """The workers' precision without a run manifest (`--precision`, default fp32)."""
    if precision is not None and manifest is not None:
        raise CommandError("--precision is for audits without --run: the run manifest states it")
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise CommandError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def _settings(run: Any, precision: str, tokenizer: Any, model_path: Path) -> tuple[Any, Any]:
    """The audit settings (the run's, or defaults at `precision`) with the model's
    calibrated limits, and the run's judge (None without a run); says both on stderr."""
    from trainer.judge import make_judge  # deferred: heavy import
    from verify.auditor import AuditSettings, settings_for_run  # deferred: heavy import

    settings = AuditSettings(precision=precision)
    judge = None
    if run is not None:
        settings = settings_for_run(run)
        judge = make_judge(run, tokenizer)
    else:
        print(
            "swarm-node audit: no --run: task, reward and run settings not checked", file=sys.stderr
        )
    settings, note = load_calibration(model_path, settings, run)
    print(f"swarm-node audit: {settings.precision} workers; {note}", file=sys.stderr)
    return settings, judge


def _open_records(records: list[Item]) -> tuple[list[tuple[int, Any]], list[dict[str, Any] | None]]:
    """(item position, opened record) of each record that opens; the output lines with the
    failed line of each stream problem and record that does not open filled in."""
    opened: list[tuple[int, Any]] = []
    lines: list[dict[str, Any] | None] = [None] * len(records)
    for k, (name, i, rec, problem, detail) in enumerate(records):
        if rec is None:
            lines[k] = {
                "file": name,
                "index": i,
                "rollout_id": None,
                "passed": False,
                "reason": problem,
                "detail": detail,
            }
            continue
        try:
            opened.append((k, open_record(rec)))
        except RemoteProtocolError as exc:
            lines[k] = {
                "file": name,
                "index": i,
                "rollout_id": None,
                "passed": False,
                "reason": "bad-record",
                "detail": str(exc) or type(exc).__name__,
            }
    return opened, lines


def _result_line(item: Item, ro: Any, res: Any) -> dict[str, Any]:
    """The output line of one audited record."""
    name, i = item[:2]
    return {
        "file": name,
        "index": i,
        "rollout_id": ro.rollout_id.hex(),
        "producer": ro.envelope.signer.hex(),
        "policy_version": ro.envelope.policy_version,
        "passed": res.passed,
        "reason": res.reason,
        "detail": res.detail,
        "failures": list(res.failures),
        "reward_claimed": ro.header.reward,
        "reward_rescored": res.reward_rescored,
        "metrics": {k: round(v, 6) for k, v in sorted(res.metrics.items())},
    }


def _write_lines(lines: list[dict[str, Any] | None], as_json: bool, out: Any) -> int:
    """Writes one line per item (JSON, or `PASS|FAIL file#index id reason: detail`);
    returns how many failed."""
    failed = 0
    for line in lines:
        assert line is not None
        failed += not line["passed"]
        if as_json:
            out.write(json.dumps(line) + "\n")
        else:
            status = "PASS" if line["passed"] else "FAIL"
            rid = (line["rollout_id"] or "-")[:16]
            text = f"{status} {line['file']}#{line['index']} {rid} {line['reason']}"
            if line.get("detail"):
                text += f": {line['detail']}"
            out.write(text + "\n")
    return failed


@click.command(name="audit")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--model", default="builtin:tiny", show_default=True, help="Model directory (or builtin:tiny)."
)
@click.option(
    "--run",
    "--manifest",
    "manifest",
    type=click.Path(path_type=Path),
    help="Run manifest: re-derive tasks and re-score rewards.",
)
@click.option("--data-dir", help="Data directory holding the built-in policy (init-model's).")
@click.option(
    "--precision",
    help="Without a manifest: the workers' compute precision, fp32 (default) or bf16.",
)
@click.option(
    "--model-version", default=0, show_default=True, type=int, help="The version --model holds."
)
@click.option(
    "--versions",
    type=click.Path(path_type=Path),
    help="Directory of model directories named by policy version (DIR/3).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per rollout.")
@one_line_errors
def command(
    files: tuple[Path, ...],
    model: str,
    manifest: Path | None,
    data_dir: str | None,
    precision: str | None,
    model_version: int,
    versions: Path | None,
    as_json: bool,
) -> None:
    """Audit rollout records: proofs, sampling replay, log-probs, termination, reward.

    Exit status 0 when every rollout passed, 1 when any failed, 2 on usage or IO errors.
    """
    sys.exit(
        main(
            files=list(files),
            model=model,
            as_json=as_json,
            manifest=manifest,
            data_dir=data_dir,
            precision=precision,
            model_version=model_version,
            versions=versions,
        )
    )
