"""What this machine has free: memory available, disk space under a path, CPU cores.

Used by `swarm-node doctor` (can this machine join?) and `swarm-node init-model --shape`
(refuses a build that clearly does not fit).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def available_memory() -> float:
    """Bytes of memory available to a new process (`MemAvailable`, else free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where a new file would land)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_disk(path: Path) -> float:
    """Bytes free on the file system that `path` (or its nearest existing ancestor) is on."""
    return float(shutil.disk_usage(existing_parent(path)).free)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's or a
    `taskset` share, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
