"""Usage errors answer at once: a missing key, record or model, a bad run file and an
`--out` that cannot be written are found before any heavy library (torch, transformers,
libp2p, vllm) is imported, and reported in one line with exit status 2.

Each case runs the real command line in a fresh interpreter (heavy modules, once imported,
stay), as `tests/test_node_cli_lazy.py` does for `--help`; the wall time of each is printed
(`pytest -s`), and the cases' no-heavy-import condition is what keeps them under 2 s (the
imports alone take 3-30 s on a busy 2-core machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.keyfile import write_key
from protocol.identity import Identity
from tests.support.disks import read_only_dir

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "libp2p", "vllm")

PROBE = """
import sys
from node.cli import cli
try:
    cli.main(args={argv!r}, prog_name="swarm-node")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("loaded:", ",".join(m for m in {heavy!r} if m in sys.modules), "exit:", code)
"""

PEER = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def _cases(tmp: Path, ro: Path) -> list[tuple[list[str], str]]:
    bad_run = tmp / "bad-run.toml"
    bad_run.write_text("garbage [\n")
    key = tmp / "k.key"
    write_key(key, Identity.generate())
    rec = tmp / "r.msgpack"
    rec.write_bytes(b"")
    return [
        (
            ["start", "--role", "inference", "--key", "/nonexistent", "--run", str(bad_run)],
            "key file",
        ),
        (
            ["start", "--role", "inference", "--key", str(key), "--run", str(bad_run)],
            "not valid TOML",
        ),
        (["start", "--role", "inference", "--key", "/nonexistent", "--join", PEER], "key file"),
        (["audit", "/nonexistent"], "no such file"),
        (["audit", str(rec), "--run", str(bad_run)], "not valid TOML"),
        (["audit", str(rec), "--model", "/nonexistent"], "does not exist"),
        (["train", "--run", str(bad_run), "/nonexistent"], "no such file"),
        (["train", "--run", str(bad_run), str(rec)], "not valid TOML"),
        (["doctor", "--run", str(bad_run)], "not valid TOML"),
        (["calibrate", "--model", "/nonexistent"], "does not exist"),
        (["runs", "/ip4/127.0.0.1/tcp/1"], "/p2p/"),
        (["sim", "churn", "--out", str(ro / "sim")], "cannot write"),
        (["init-model", "--shape", "qwen2-test", "--out", str(ro / "m")], "cannot write"),
        (["keygen", "--out", str(ro / "k.key")], "cannot write"),
    ]


def test_usage_errors_are_one_line_before_any_heavy_import(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWARM_NODE_DATA": str(tmp_path / "data")}
    with read_only_dir(tmp_path) as ro:
        for argv, says in _cases(tmp_path, ro):
            started = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env=env,
                timeout=120,
            )
            took = time.monotonic() - started
            print(f"{took:5.2f} s  swarm-node {' '.join(argv)}")
            last = result.stdout.rstrip("\n").splitlines()[-1]
            assert last == "loaded:  exit: 2", (argv, result.stdout[-500:], result.stderr[-2000:])
            assert result.stderr.count("\n") == 1, (argv, result.stderr)
            assert result.stderr.startswith("swarm-node: error: "), (argv, result.stderr)
            assert says in result.stderr, (argv, result.stderr)


@pytest.mark.parametrize("name", ["sim"])
def test_sim_refuses_a_read_only_out_before_simulating(tmp_path: Path, name: str) -> None:
    """The simulation (minutes) does not run when its results could not be written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with read_only_dir(tmp_path) as ro:
        result = subprocess.run(
            [sys.executable, "-m", "node.cli", name, "byzantine", "--out", str(ro / "x")],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    assert "sim: " not in result.stderr, result.stderr  # no banner, no progress
