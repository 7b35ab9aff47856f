"""`swarm-node run sign RUN.toml --key AUTHORITY.key [--version N] [--out FILE]
[--pin-model DIR]`: release a run manifest signed by its run authority.

Writes the run file (in place, or to `--out`) with a `[release]` section: the version
(default: one above the file's current release, or 1), the authority's peer id, the time
and the signature (`node.run_file` reads it back, `protocol.run_manifest` has the rules).
Peers adopt a release only from the authority they trust and only when its version is
higher than the one they hold, so every update needs the same key and a higher version.

`--pin-model DIR` first pins the run's model to that directory: `model_digest` (its
weights, policy version 0) and `model_files_digest` (its other files: config, tokenizer,
calibration; `protocol.model_bundle`), so a node can join with no model of its own and
fetch it from the run's peers, checked against the signed release. The file is then
rewritten from the manifest (comments are not kept).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import click

from node.cli_errors import one_line_errors
from node.config import read_toml
from node.errors import CommandError
from node.keyfile import read_key
from node.model_fetch import read_bundle_files
from node.run_file import manifest_from_table, manifest_to_toml, release_to_toml
from protocol import run_manifest as rm
from protocol.content_id import content_id
from protocol.identity import peer_id_to_b58
from protocol.model_bundle import encode_bundle
from protocol.wire import RunManifest
from trainer.checkpoint import CheckpointError, from_model_dir
from trainer.model_dir import ModelDirError, check_model_dir


def without_release(text: str) -> str:
    """`text` with its `[release]` section (header to the next table or the end) removed."""
    out, skipping = [], False
    for line in text.splitlines():
        header = line.strip()
        if header.startswith("["):
            skipping = header.split("#")[0].strip() == "[release]"
        if not skipping:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def pin_model(manifest: RunManifest, model_dir: Path) -> RunManifest:
    """`manifest` with its model pinned to `model_dir` (weights and other files)."""
    try:
        check_model_dir(model_dir)
        weights = from_model_dir(model_dir)
        files = encode_bundle(read_bundle_files(model_dir))
    except (ModelDirError, CheckpointError, ValueError) as exc:
        raise CommandError(f"--pin-model: {exc}") from None
    except OSError as exc:
        raise CommandError(f"--pin-model: cannot read {model_dir}: {exc.strerror or exc}") from None
    return dataclasses.replace(
        manifest, model_digest=content_id(weights), model_files_digest=content_id(files)
    )


def main(
    path: Path,
    key: Path,
    version: int | None = None,
    out: Path | None = None,
    model_dir: Path | None = None,
) -> None:
    """Sign the run file at `path` with the authority key `key` as release `version`
    (default: one above the current), writing `out` or the file itself; with `model_dir`,
    pin the run's model to it first."""
    authority = read_key(key)
    table = read_toml(path, "run manifest")
    manifest = manifest_from_table(table, source=str(path))
    if model_dir is not None:
        manifest = pin_model(manifest, model_dir)
    release = table.get("release")
    old: dict[str, Any] = release if isinstance(release, dict) else {}
    old_version: int = old["version"] if type(old.get("version")) is int else 0
    old_authority = old.get("authority")
    if old_authority and old_authority != authority.peer_id_b58:
        raise CommandError(
            f"{path} was released by {old_authority}; {key} is {authority.peer_id_b58}: peers "
            "refuse a release signed by another key (remove [release] to start a new run)"
        )
    version = old_version + 1 if version is None else version
    if version < 1 or version <= old_version:
        raise CommandError(
            f"--version must be above the file's current release {old_version}, got {version}"
        )
    data = rm.seal_release(authority, manifest, version, int(time.time() * 1000))
    target = out or path
    try:
        text = (
            manifest_to_toml(manifest)
            if model_dir is not None
            else without_release(path.read_text())
        )
        target.write_text(f"{text}\n{release_to_toml(data)}")
    except OSError as exc:
        raise CommandError(f"cannot write {target}: {exc.strerror or exc}") from None
    if model_dir is not None:
        click.echo(
            f"pinned the model in {model_dir}: weights {manifest.model_digest.hex()[:16]}..., "
            f"files {manifest.model_files_digest.hex()[:16]}... (joiners fetch it from the run)"
        )
    click.echo(
        f"released run {manifest.run_id!r} version {version} signed by "
        f"{peer_id_to_b58(authority.peer_id)} -> {target}"
    )


@click.group(name="run")
def group() -> None:
    """Release a run: sign its manifest as the run authority."""


@group.command(name="sign")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--key",
    required=True,
    type=click.Path(path_type=Path),
    help="The run authority's key file.",
)
@click.option(
    "--version",
    "version",
    type=int,
    help="Manifest version (default: one above the file's current release, or 1).",
)
@click.option("--out", type=click.Path(path_type=Path), help="Write here instead of in place.")
@click.option(
    "--pin-model",
    "model_dir",
    type=click.Path(path_type=Path),
    help="Pin the run's model to this directory first (weights and files), so nodes can "
    "join without it and fetch it from the run.",
)
@one_line_errors
def sign(
    path: Path, key: Path, version: int | None, out: Path | None, model_dir: Path | None
) -> None:
    """Sign run file PATH as the run authority (adds a [release] section)."""
    main(path, key, version, out, model_dir)
