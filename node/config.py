"""Node configuration: one TOML file, overridden by command-line flags, validated as a table.

Every key is declared once in `NODE_KEYS` with its type, default and allowed values.
Paths in the file (`PATH_KEYS`) are relative to the file; an empty `node.data_dir` means
the default (`node.paths`). Errors
name the bad key and what is allowed: `network.io_timeout_s: expected a number in
(0, 600], got 'soon'`. Unknown sections and keys are errors too (a typo must not be
silently ignored). The run manifest has its own loader, `node.run_file`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.errors import CommandError
from protocol.wire import ROLES

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Key:
    """One configuration key: dotted name, default, and a checker returning the clean value."""

    name: str
    default: Any
    check: Callable[[Any], Any]
    allowed: str
    help: str = ""


class _Bad(ValueError):
    pass


def number(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _Bad
        if (v <= lo if lo_open else v < lo) or v > hi:
            raise _Bad
        return float(v)

    return check


def integer(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _Bad
        return v

    return check


def choice(*options: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in options:
            raise _Bad
        return v

    return check


def text(v: Any) -> str:
    if not isinstance(v, str):
        raise _Bad
    return v


def multiaddr_list(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list | tuple) or not all(
        isinstance(a, str) and a.startswith("/") for a in v
    ):
        raise _Bad
    return tuple(v)


def default_data_dir() -> str:
    return os.environ.get("SWARM_NODE_DATA") or str(Path.home() / ".cache" / "swarm-node")


NODE_KEYS: tuple[Key, ...] = (
    Key("node.role", "inference", choice(*ROLES), " | ".join(ROLES), "what this process does"),
    Key("node.key", "", text, "a path", "identity key file (swarm-node keygen); required"),
    Key("node.run", "", text, "a path", "run manifest TOML; required unless --join"),
    Key("node.data_dir", "", text, "a path", "this node's directory (see node.paths)"),
    Key("node.model", "", text, "a path or empty", "model directory (default: the run's)"),
    Key(
        "node.listen",
        ("/ip4/127.0.0.1/tcp/0",),
        multiaddr_list,
        "multiaddrs like /ip4/127.0.0.1/tcp/4001",
    ),
    Key("node.bootstrap", (), multiaddr_list, "multiaddrs ending in /p2p/<peer id>"),
    Key("node.log_level", "info", choice(*LOG_LEVELS), " | ".join(LOG_LEVELS)),
    Key("node.log_format", "text", choice("text", "json"), "text | json"),
    Key("node.metrics", "", text, "HOST:PORT or empty", "Prometheus endpoint (empty: none)"),
    Key("network.dial_timeout_s", 10.0, number(0, 600, lo_open=True), "a number in (0, 600]"),
    Key("network.io_timeout_s", 10.0, number(0, 600, lo_open=True), "a number in (0, 600]"),
    Key("network.heartbeat_interval_s", 1.0, number(0, 60, lo_open=True), "a number in (0, 60]"),
    Key("network.heartbeat_timeout_s", 6.0, number(0, 600, lo_open=True), "a number in (0, 600]"),
    Key(
        "network.max_message_bytes",
        1_000_000,
        integer(1024, 1_000_000),
        "an integer in [1024, 1000000]",
    ),
    Key("network.publish_rate_per_s", 8.0, number(0, 10, lo_open=True), "a number in (0, 10]"),
    Key(
        "network.header_batch",
        32,
        integer(1, 64),
        "an integer in [1, 64]",
        "signed rollout headers per gossip message at most (1: no batching)",
    ),
    Key("network.max_peers", 64, integer(1, 10_000), "an integer in [1, 10000]"),
    Key(
        "network.upload_limit_mib_s",
        0.0,
        number(0, 100_000),
        "a number in [0, 100000] (0: no cap)",
        "cap on weight shard uploads, MiB/s for all peers together",
    ),
    Key(
        "weights.max_version_mib",
        16384.0,
        number(0, 10_000_000, lo_open=True),
        "a number in (0, 10000000]",
        "refuse a policy version larger than this before downloading it",
    ),
    Key(
        "weights.shard_mib",
        64.0,
        number(0.0625, 64),
        "a number in [0.0625, 64]",
        "shard size this node cuts when it publishes versions (trainer)",
    ),
    Key(
        "trainer.publish_every_s",
        0.0,
        number(0, 86_400),
        "a number in [0, 86400] (0: never)",
        "until training lands: publish perturbed weights every this many seconds",
    ),
    Key(
        "trainer.micro_batch",
        8,
        integer(1, 4096),
        "an integer in [1, 4096]",
        "sequences per forward/backward pass; gradients accumulate into one step",
    ),
    Key("inference.batch_size", 8, integer(1, 4096), "an integer in [1, 4096]"),
    Key(
        "inference.rollouts_per_version",
        0,
        integer(0, 1_000_000),
        "an integer >= 0 (0: no bound)",
        "rollouts made per policy version the trainer publishes, at most max_staleness - 1 versions ahead",
    ),
    Key("inference.engine", "hf", choice("hf", "vllm"), "hf | vllm", "generation engine"),
    Key("validator.audit_fraction", 0.25, number(0, 1), "a number in [0, 1]"),
    Key(
        "validator.producer_window_fraction",
        0.0625,
        number(0, 1),
        "a number in [0, 1]",
        "share of each producer's windows of 16 records audited whole (per-producer evidence)",
    ),
    # The relay service's limits (`--role relay`; node.host.relay.RelayLimitsConfig's defaults)
    Key(
        "relay.max_reservations",
        128,
        integer(1, 100_000),
        "an integer in [1, 100000]",
        "peers holding a relay slot at once (one per peer id)",
    ),
    Key(
        "relay.max_reservations_per_ip",
        8,
        integer(1, 100_000),
        "an integer in [1, 100000]",
        "of those, from one IP address",
    ),
    Key(
        "relay.max_circuits_per_peer",
        8,
        integer(1, 1024),
        "an integer in [1, 1024]",
        "live relayed connections to one peer holding a slot",
    ),
    Key(
        "relay.max_circuit_bytes",
        256 * 1024**2,
        integer(1024, 2**40),
        "an integer of bytes in [1024, 2^40]",
        "bytes one relayed connection may carry, both directions",
    ),
    Key(
        "relay.max_circuit_s",
        1800,
        integer(1, 7 * 86_400),
        "an integer in [1, 604800]",
        "seconds one relayed connection may last",
    ),
    Key(
        "relay.reservation_ttl_s",
        3600,
        integer(10, 7 * 86_400),
        "an integer in [10, 604800]",
        "a slot lasts this long unless the peer refreshes it",
    ),
    Key(
        "store.max_bytes",
        4 * 1024**3,
        integer(1_000_000, 2**50),
        "an integer of bytes in [1000000, 2^50]",
        "the store prunes to stay under this (never our own unacknowledged work, scores, bans)",
    ),
)


PATH_KEYS = ("node.key", "node.run", "node.data_dir", "node.model")


class Config(Mapping[str, Any]):
    """Validated settings, read by dotted name: `cfg["network.io_timeout_s"]`."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """Parse a TOML file; every failure is a one-line `CommandError`."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise CommandError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise CommandError(f"{what} {path} is a directory, not a TOML file") from None
    except OSError as exc:
        raise CommandError(f"cannot read {what} {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CommandError(f"{what} {path} is not valid TOML: {exc}") from None


def _flatten(table: dict[str, Any], source: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    sections = sorted({k.name.split(".")[0] for k in NODE_KEYS})
    for section, body in table.items():
        if section not in sections:
            raise CommandError(
                f"{source}: unknown section [{section}]; allowed: {', '.join(sections)}"
            )
        if not isinstance(body, dict):
            raise CommandError(f"{source}: '{section}' must be a table [{section}]")
        for key, value in body.items():
            flat[f"{section}.{key}"] = value
    return flat


def load_config(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file (if given), then `overrides` (flags; None values skipped)."""
    known = {k.name: k for k in NODE_KEYS}
    raw: dict[str, Any] = {}
    if path is not None:
        raw.update(_flatten(read_toml(path, "config file"), str(path)))
        for name in PATH_KEYS:  # paths in the file are relative to the file
            value = raw.get(name)
            if isinstance(value, str) and value and not value.startswith("builtin:"):
                raw[name] = str((path.parent / Path(value).expanduser()).resolve())
    for name, value in (overrides or {}).items():
        if value is not None:
            raw[name] = value
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = known.get(name)
        if key is None:
            section = name.split(".")[0]
            options = [k for k in known if k.startswith(section + ".")] or list(known)
            raise CommandError(f"unknown config key {name!r}; allowed: {', '.join(options)}")
        try:
            values[name] = key.check(value)
        except _Bad:
            raise CommandError(f"{name}: expected {key.allowed}, got {value!r}") from None
    for key in NODE_KEYS:
        values.setdefault(key.name, key.default)
    if values["network.heartbeat_timeout_s"] <= values["network.heartbeat_interval_s"]:
        raise CommandError(
            "network.heartbeat_timeout_s: expected more than network.heartbeat_interval_s"
            f" ({values['network.heartbeat_interval_s']}), got {values['network.heartbeat_timeout_s']}"
        )
    if values["relay.max_reservations_per_ip"] > values["relay.max_reservations"]:
        raise CommandError(
            "relay.max_reservations_per_ip: expected at most relay.max_reservations"
            f" ({values['relay.max_reservations']}), got {values['relay.max_reservations_per_ip']}"
        )
    return Config(values)
