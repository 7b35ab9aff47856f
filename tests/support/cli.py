"""The `swarm-node` command in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m node.cli ARGS` on this checkout's code (PYTHONPATH leads with the repository
    root, whatever `cwd`); `env` adds to (and overrides) this process's environment."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )
