"""One node process of a local devnet (`NodeProc`), shared by the runner
(`node.commands.devnet`) and its report (`node.commands.devnet_report`)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class NodeProc:
    """One node process of the devnet: its name, role, folder, process, log, status page
    and what its status file and start-up lines said last."""

    name: str
    role: str
    dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    peer_id: str = ""
    addr: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    page: str = ""  # the node's status page URL
    exit_code: int | None = None

    def read_status(self) -> None:
        """Re-read the node's status file (kept as it was when unreadable)."""
        try:
            self.status = json.loads((self.dir / "data" / "status.json").read_text())
        except (OSError, ValueError):
            pass

    def banner(self) -> tuple[str, str]:
        """(peer id, first listen address) from the node's start-up lines, if printed yet."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "", ""
        peer = addr = ""
        for line in text.splitlines():
            if line.startswith("swarm-node: peer "):
                peer = line.split()[-1]
            elif line.strip().startswith("listening on ") and not addr:
                addr = line.strip().split()[-1]
        return peer, addr
