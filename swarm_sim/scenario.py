"""Scenarios: a TOML file (or a built-in name) -> the settings of every model.

What lives here: `Scenario`, `load(name_or_path)` and `BUILTINS`. A scenario file has a
`name`, a `kind` ("gossip", the default, or "broadcast") and one table per model, each
key being a field of that model's settings class:

    [workload]   swarm_sim.swarm.Workload        peers, duration, publish rate, pulls, S...
    [network]    swarm_sim.network.NetConfig     regions, latency_ms, bandwidths, loss...
    [gossip]     swarm_sim.gossipsub.GossipConfig  d, d_lo, d_hi, d_lazy, heartbeat_s...
    [churn]      swarm_sim.churn.ChurnConfig     churn_per_hour, distribution, crashes...
    [adversary]  swarm_sim.adversary.AdversaryConfig  fractions = {spam = 0.02, ...}, rates
    [broadcast]  swarm_sim.broadcast.BroadcastConfig  (kind = "broadcast") peers, sizes

An unknown table or key, or a value the settings class refuses, is a `ScenarioError`
with one line naming the file and the key. Built-ins live in `swarm_sim/scenarios/`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm_sim.adversary import AdversaryConfig
from swarm_sim.broadcast import BroadcastConfig
from swarm_sim.churn import ChurnConfig
from swarm_sim.gossipsub import GossipConfig
from swarm_sim.network import NetConfig
from swarm_sim.swarm import Workload

__all__ = ["BUILTINS", "Scenario", "ScenarioError", "load", "parse"]

SCENARIO_DIR = Path(__file__).with_name("scenarios")
BUILTINS = tuple(sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")))

_TABLES: dict[str, type] = {
    "workload": Workload,
    "network": NetConfig,
    "gossip": GossipConfig,
    "churn": ChurnConfig,
    "adversary": AdversaryConfig,
    "broadcast": BroadcastConfig,
}


class ScenarioError(ValueError):
    """A scenario that cannot be run (the message is one line)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named scenario: its kind and the settings of every model."""

    name: str
    kind: str = "gossip"
    workload: Workload = field(default_factory=Workload)
    network: NetConfig = field(default_factory=NetConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    broadcast: BroadcastConfig = field(default_factory=BroadcastConfig)
    source: str = ""

    def replace(self, **tables: dict[str, Any]) -> Scenario:
        """A copy with some fields of some tables changed (`workload={"peers": 50}`)."""
        changes = {k: _build(self.source, k, v, getattr(self, k, None)) for k, v in tables.items()}
        return dataclasses.replace(self, **changes)


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _build(source: str, table: str, values: Any, base: Any = None) -> Any:
    cls = _TABLES.get(table)
    if cls is None:
        raise ScenarioError(f"{source}: unknown table [{table}] (known: {', '.join(_TABLES)})")
    if not isinstance(values, dict):
        raise ScenarioError(f"{source}: [{table}] must be a table")
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ScenarioError(f"{source}: unknown key {table}.{key}")
    kwargs = {k: _tuples(v) for k, v in values.items()}
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{source}: [{table}] {exc}") from None


def parse(text: str, source: str = "<scenario>") -> Scenario:
    """Build a scenario from TOML text."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    name = doc.pop("name", None) or Path(source).stem
    kind = doc.pop("kind", "gossip")
    if kind not in ("gossip", "broadcast"):
        raise ScenarioError(f"{source}: kind must be 'gossip' or 'broadcast', not {kind!r}")
    tables = {}
    for key, value in doc.items():
        if key not in _TABLES:
            raise ScenarioError(f"{source}: unknown key or table {key!r}")
        tables[key] = _build(source, key, value)
    return Scenario(name=str(name), kind=kind, source=source, **tables)


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a TOML file by path."""
    if name_or_path in BUILTINS:
        path = SCENARIO_DIR / f"{name_or_path}.toml"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ScenarioError(
                f"no scenario {name_or_path!r}: not a file, and the built-ins are"
                f" {', '.join(BUILTINS)}"
            )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    return parse(text, str(path))
