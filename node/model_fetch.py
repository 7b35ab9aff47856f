"""A joining peer's model, taken from the run: no model directory needed beforehand.

`fetch_model` (run by `swarm-node start --join` when no model directory of the run's is
found) takes from the connected peers, over `node.exchange.model_files`: the bundle of the
model's files other than weights (`protocol.model_bundle`), checked against the run
manifest's `model_files_digest`, then the weights: the newest policy version the peers
announce, through the node's own weight sync (signed manifests, checked shards), or,
while the run is still at version 0, version 0's weights checked against `model_digest`.
Only the version used is downloaded in full; progress lines go to `say` every few seconds.
A peer whose bytes do not match the pin is charged (`penalties.BAD_MODEL_FILES`) and the
next one is asked.

The model goes to `<data root>/models/run-<digest>/`, written under a temporary name and
renamed when complete, with `FETCHED_FILE` naming the policy version its weights are, so a
restart finds it and does not take a later version's weights for version 0.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from node.errors import CommandError
from protocol.model_bundle import MAX_BUNDLE_BYTES, BundleError, bundled, decode_bundle
from trainer.checkpoint import ModelDirWeights, model_dir_weights

PEERS_WAIT_S = 60.0  # for a first connection after start-up
VERSION_WAIT_S = 10.0  # for the peers' hellos naming their newest version
PROGRESS_EVERY_S = 3.0
WEIGHTS_WAIT_S = 3600.0  # for the newest version's download (a 7B version on a slow link)
FETCHED_FILE = ".swarm-fetched.json"


def read_bundle_files(model_dir: Path) -> dict[str, bytes]:
    """The files of `model_dir` that go into its bundle (`protocol.model_bundle.bundled`)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(model_dir.iterdir())
        if p.is_file() and bundled(p.name)
    }


def model_availability(manifest: Any, model: str | None, models_root: Path) -> tuple[str, str]:
    """(level, line) for `doctor`: where a node would find the run's model — `model` (the
    `--model` given, or None for the run's), a directory fetched before, or the run's
    peers when the run pins its files — with level "ok", or "FAIL" when it has none."""
    from node.paths import resolve_model  # deferred: needs the CLI's error type only here
    from trainer.model_dir import ModelDirError, check_model_dir  # deferred: see above

    try:
        path = check_model_dir(resolve_model(model, manifest.model, models_root))
        return "ok", f"model: {path}"
    except (CommandError, ModelDirError) as exc:
        missing = str(exc)
    if manifest.model_files_digest:
        dest = fetched_dir(models_root, manifest.model_files_digest)
        if (dest / "config.json").is_file():
            return "ok", f"model: fetched before, in {dest}"
        return "ok", (
            "model: none here; `start --join` fetches it from the run's peers "
            f"(files pinned {manifest.model_files_digest.hex()[:16]}...) into {dest}"
        )
    return "FAIL", (
        f"model: {missing}; the run does not pin its model files for joiners to fetch "
        "(model_files_digest): get the model directory and pass --model DIR"
    )


def fetched_dir(data_root: Path, files_digest: bytes) -> Path:
    """Where the model pinned by `files_digest` is kept once fetched."""
    return data_root / "models" / f"run-{files_digest.hex()[:16]}"


def fetched_version(model_dir: Path) -> int | None:
    """The policy version of a fetched directory's weights, or None for a directory that
    was not fetched (its weights are version 0 as the run pins them)."""
    try:
        return int(json.loads((model_dir / FETCHED_FILE).read_text())["weights_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_dir(dest: Path, files: dict[str, bytes], weights: bytes | Path, version: int) -> None:
    """`dest` with `files`, `weights` (checkpoint bytes, or a checkpoint file read through a
    memory map) as model.safetensors and the FETCHED_FILE marker, written beside it and
    renamed into place."""
    from safetensors.torch import save_file  # deferred: heavy import

    from trainer.checkpoint import mapped_state_dict, to_state_dict  # deferred: heavy import

    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        state = mapped_state_dict(weights) if isinstance(weights, Path) else to_state_dict(weights)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / FETCHED_FILE).write_text(json.dumps({"weights_version": version}))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CommandError(
            f"cannot write the fetched model to {dest}: {exc.strerror or exc}"
        ) from None


async def fetch_model(
    peer: Any, manifest: Any, dest: Path, say: Callable[[str], None]
) -> ModelDirWeights | None:
    """Fetch the run's model into `dest` (see the module docstring). Returns version 0's
    weights (in `dest`) when those were fetched (the caller installs them as version 0),
    or None when the weights are a later version the weight sync already installed."""
    from node.exchange.model_files import fetch_blob  # deferred: heavy import (libp2p)

    host, run_id = peer.host, manifest.run_id

    def charge(who: str, why: str) -> None:
        from protocol import penalties  # deferred: only on a bad answer

        offence = penalties.BAD_MODEL_FILES
        peer.report(who, offence.cost, why, offence.name)

    with trio.move_on_after(PEERS_WAIT_S):
        while not host.connected_peers():
            await trio.sleep(0.2)
    if not host.connected_peers():
        raise CommandError(f"no peer connected within {PEERS_WAIT_S:g} s to fetch the model from")
    say("model: no model directory here: fetching the run's model from its peers")
    bundle = await fetch_blob(
        host,
        host.connected_peers,
        run_id,
        manifest.model_files_digest,
        "model files",
        say,
        charge,
        MAX_BUNDLE_BYTES,
    )
    try:
        files = decode_bundle(bundle, manifest.model_files_digest)
    except BundleError as exc:
        raise CommandError(f"the run's model files: {exc}") from None
    weights = peer.weights
    with trio.move_on_after(VERSION_WAIT_S):
        while weights.known_top() < 1:
            await trio.sleep(0.2)
    top = weights.known_top()
    if top >= 1:
        say(f"model: downloading policy version {top} (the run's newest) ...")
        with trio.move_on_after(WEIGHTS_WAIT_S):
            await weights.wait_installed(top, say=say, every_s=PROGRESS_EVERY_S)
        if (weights.newest() or 0) < top:
            raise CommandError(
                f"policy version {top} was not downloaded within {WEIGHTS_WAIT_S:g} s: "
                "no peer served its shards (check `swarm-node doctor`)"
            )
        version = max(weights.installed())
        path = weights.path(version)  # the store's file, mapped: never held whole as bytes
        await trio.to_thread.run_sync(_write_dir, dest, files, path, version)
        say(f"model: ready in {dest} (weights of policy version {version})")
        return None
    if not manifest.model_digest:
        raise CommandError(
            "the run has published no version yet and its manifest does not pin "
            "model_digest: give the model directory with --model DIR"
        )
    say("model: the run is at version 0: downloading its base weights ...")
    data = await fetch_blob(
        host,
        host.connected_peers,
        run_id,
        manifest.model_digest,
        "base weights",
        say,
        charge,
    )
    await trio.to_thread.run_sync(_write_dir, dest, files, data, 0)
    del data
    say(f"model: ready in {dest} (the run's base weights)")
    return await trio.to_thread.run_sync(model_dir_weights, dest)
