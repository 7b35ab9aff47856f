"""Peer configurations for in-process peers (`node.peer.peer.open_peer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.peer.peer import PeerConfig
from protocol.identity import Identity


def relay_config(tmp: Path, name: str, manifest: Any, **kw: Any) -> PeerConfig:
    """A relay with a fresh identity and its data under `tmp / name`."""
    return PeerConfig(
        manifest=manifest, identity=Identity.generate(), data_dir=tmp / name, roles=("relay",), **kw
    )
