"""`bench scale`'s parts, each in a child process under a memory cap.

A part is a function `f(config: dict) -> dict` named `"module:function"`; it runs in a
fresh interpreter (`python -m swarm_node_bench.parts.scale_child`), so one part's model,
optimiser state and allocator arenas never add to the next one's, and a part that runs out
of memory ends only itself. The parent:

1. refuses to start a part whose estimated need exceeds the cap or the memory available
   now (`MemAvailable`): `"skipped: needs X GiB ..."`;
2. watches the resident set of the child and its descendants (`/proc/PID/status`,
   `VmRSS`) every `POLL_S`; past the cap the child is killed (SIGKILL) and the part is
   `"oom"`. A child killed by the kernel's
   OOM killer (SIGKILL from outside) or ending in `MemoryError` is `"oom"` too;
3. reads the part's result from a JSON file the child writes (the child's stdout goes to
   stderr with its progress, so the bench's own stdout stays one JSON line).

Every outcome is a dict with `status`: "ok", "oom", "skipped: <why>", "timeout" or
"failed: <last line of the child's error>"; "ok" results also carry the part's figures
and `child_peak_rss_gib` (the largest resident set the parent saw).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node.resources import available_memory

GIB = 2**30
POLL_S = 0.2
CHILD_MODULE = "swarm_node_bench.parts.scale_child"


def rss_bytes(pid: int) -> int:
    """Resident set of process `pid` in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident set of process `pid` and all its descendants, in bytes."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss_bytes(p)
        todo.extend(children.get(p, []))
    return total


def need_check(need_bytes: float, cap_bytes: float) -> str | None:
    """Why a part needing `need_bytes` cannot start under `cap_bytes` now, or None."""
    avail = available_memory()
    if need_bytes > cap_bytes:
        return (
            f"skipped: needs {need_bytes / GIB:.1f} GiB, over the cap of {cap_bytes / GIB:.1f} GiB"
        )
    if need_bytes > avail:
        return f"skipped: needs {need_bytes / GIB:.1f} GiB, {avail / GIB:.1f} GiB available"
    return None


def run_capped(
    target: str,
    config: dict[str, Any],
    *,
    cap_bytes: float,
    need_bytes: float = 0.0,
    timeout_s: float = 3600.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run part `target` ("module:function") on `config` in a child process under
    `cap_bytes` of resident memory; the outcome as in the module docstring."""
    why = need_check(need_bytes, cap_bytes)
    if why is not None:
        return {"status": why}
    with tempfile.TemporaryDirectory(prefix="swarm-bench-scale-") as tmp:
        cfg_file, out_file = Path(tmp) / "config.json", Path(tmp) / "result.json"
        cfg_file.write_text(json.dumps(config))
        cmd = [sys.executable, "-m", CHILD_MODULE, target, str(cfg_file), str(out_file)]
        child_env = {**os.environ, **(env or {})}
        # its own process group, so a kill ends its descendants too (the e2e part's nodes)
        err = _stderr()
        proc = subprocess.Popen(cmd, stdout=err, stderr=err, env=child_env, start_new_session=True)
        peak, killed, t0 = 0, None, time.monotonic()
        try:
            while proc.poll() is None:
                peak = max(peak, tree_rss_bytes(proc.pid))
                if peak > cap_bytes:
                    killed = "oom"
                elif time.monotonic() - t0 > timeout_s:
                    killed = "timeout"
                if killed is not None:
                    _kill_group(proc)
                    break
                time.sleep(POLL_S)
        finally:
            if proc.poll() is None:  # the parent itself was interrupted
                _kill_group(proc)
        if killed is not None:
            return {"status": killed, "child_peak_rss_gib": round(peak / GIB, 2)}
        result = _read_result(out_file)
        if proc.returncode == -signal.SIGKILL:
            return {"status": "oom", "child_peak_rss_gib": round(peak / GIB, 2)}
        if result is None:
            return {"status": f"failed: child exit status {proc.returncode}, no result"}
        result.setdefault("status", "ok")
        result["child_peak_rss_gib"] = round(peak / GIB, 2)
        return result


def _stderr() -> Any:
    """This process's stderr for a child to write to, or None (inherit the real one) when
    it is not a file (a test's capture)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the child and what it started) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
