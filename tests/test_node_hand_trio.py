"""The hand-started trio: a trainer, a validator and an inference worker started by hand
(`swarm-node start --role ...`, separate processes on 127.0.0.1, default settings) train
through at least one published version that the worker installs, and end with no penalty
against any of the three (read from their ledgers as the devnet report reads them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node.commands.devnet import NodeProc
from node.commands.devnet_report import penalties
from node.keyfile import write_key
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from tests.support.cli import ROOT
from trainer.model_dir import save_model_dir
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table

pytestmark = [pytest.mark.network, pytest.mark.slow]

RUN_S = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_file(tmp: Path, keys: dict[str, Identity]) -> Path:
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    table = run_manifest_table(run_id="hand-trio", seed=3)
    table["run"]["model"] = str(save_model_dir(model, tok, tmp / "model"))
    table["run"]["trainer_keys"] = [keys["trainer"].peer_id_b58]
    table["run"]["validator_keys"] = [keys["validator"].peer_id_b58]
    table["sampling"]["max_new_tokens"] = 24
    table["rl"]["groups_per_step"] = 2
    table["rl"]["publish_every"] = 2  # verified groups per version: a publish within the run
    path = tmp / "run.toml"
    path.write_text(manifest_to_toml(manifest_from_table(table)))
    return path


def _start(tmp: Path, role: str, run: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(tmp / f"{role}.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "node.cli",
                "start",
                "--role",
                role,
                "--run",
                str(run),
                "--key",
                str(tmp / f"{role}.key"),
                "--data-dir",
                str(tmp / role / "data"),
                "--listen",
                f"/ip4/127.0.0.1/tcp/{port}",
                "--duration",
                str(RUN_S),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _status(tmp: Path, role: str) -> dict:
    try:
        return json.loads((tmp / role / "data" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def test_hand_started_trio_publishes_installs_and_charges_no_honest_peer(tmp_path: Path) -> None:
    keys = {role: Identity.generate() for role in ("trainer", "validator", "inference")}
    for role, ident in keys.items():
        write_key(tmp_path / f"{role}.key", ident)
    run = _run_file(tmp_path, keys)
    ports = {role: _free_port() for role in keys}
    boot = f"/ip4/127.0.0.1/tcp/{ports['trainer']}/p2p/{keys['trainer'].peer_id_b58}"
    procs = {"trainer": _start(tmp_path, "trainer", run, ports["trainer"])}
    try:
        for role in ("validator", "inference"):
            procs[role] = _start(tmp_path, role, run, ports[role], "--bootstrap", boot)
        for role, p in procs.items():
            assert p.wait(timeout=RUN_S + 90) == 0, (tmp_path / f"{role}.log").read_text()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = {role: (tmp_path / f"{role}.log").read_text() for role in keys}
    worker = _status(tmp_path, "inference")
    assert worker.get("policy_version", 0) >= 1, logs["trainer"][-3000:]  # a version installed
    assert "weights: installed version 1" in logs["inference"], logs["inference"][-3000:]
    nodes = [
        NodeProc(
            role,
            role,
            tmp_path / role,
            proc=None,
            log=tmp_path / f"{role}.log",  # type: ignore[arg-type]
            peer_id=ident.peer_id_b58,
        )
        for role, ident in keys.items()
    ]
    honest = [g for g in penalties(nodes) if g["honest"]]
    assert honest == [], honest
    # from the first node's stop on, its peers may redial it while it closes: not counted
    stopped = min(
        _stamp(line)
        for log in logs.values()
        for line in log.splitlines()
        if "stopping: --duration reached" in line
    )
    for role, log in logs.items():
        assert "Traceback" not in log, f"{role}: {log[log.find('Traceback') :][:2000]}"
        assert "banned" not in log and "keeps closing our connections" not in log, (
            f"{role}: {log[-3000:]}"
        )
        # connections hold through the installs: each node connects once to each other one
        running = [line for line in log.splitlines() if _stamp(line) and _stamp(line) < stopped]
        assert sum("peer connected" in line for line in running) == 2, f"{role}: {log[-3000:]}"
        assert not any("peer disconnected" in line for line in running), f"{role}: {log[-3000:]}"


def _stamp(line: str) -> str:
    """The log line's timestamp ("2026-12-04 10:37:44,935", sortable as text), or ""."""
    head = line[:23]
    return (
        head if len(head) == 23 and head[4] == "-" and head[10] == " " and head[19] == "," else ""
    )
