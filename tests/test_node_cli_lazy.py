"""`swarm-node --help`, `swarm-node <command> --help` and usage errors load no heavy
library: each command's module defers torch, transformers and libp2p to when it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from node.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "libp2p", "vllm")

PROBE = """
import sys
from node.cli import cli
for args in {argv!r}:
    try:
        cli.main(args=args, prog_name="swarm-node")
    except SystemExit:
        pass
print("loaded:", ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_help_and_usage_errors_import_no_heavy_library() -> None:
    argv = [["--help"], ["no-such-command"]]
    argv += [[name, "--help"] for name in COMMANDS]
    argv += [["run", "sign", "--help"], ["start", "--no-such-flag"], ["start", "--role", "x"]]
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("loaded:"), result.stdout[-2000:]
    assert last == "loaded: ", f"--help and usage errors imported {last}"
    for name in COMMANDS:
        assert f"Usage: swarm-node {name}" in result.stdout, name
