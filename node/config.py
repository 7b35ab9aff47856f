"""Node configuration: one typed tree, read from a TOML file and overridden by flags.

`NodeConfig` is the tree: one frozen dataclass per TOML section (`[node]`, `[network]`, ...),
one field per key. Each field carries its checker (type and bounds), the allowed values in
words, its help text and, when `swarm-node start` has a flag for it, the flag's name and
help. Everything else is derived from these fields:

- the TOML loader `load_config` (unknown sections and keys are errors; a typo must not be
  silently ignored; paths in the file are relative to the file);
- `start`'s click options (`config_options`), so a flag is declared once;
- the flat key list `NODE_KEYS` (the README and bench read the defaults from it);
- the reference `docs/CONFIG.md` (`reference_markdown`; `python -m node.config` prints it).

Errors name the bad key and what is allowed: `network.io_timeout_s: expected a number in
(0, 600], got 'soon'`. The run manifest has its own loader, `node.run_file`; the settings
objects of the host, peer and relay are built from the tree by `node.settings`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from node.errors import CommandError
from protocol.wire import ROLES

LOG_LEVELS = ("debug", "info", "warning", "error")


class BadValue(ValueError):
    """Raised by a checker when a value is outside what its key allows."""


@dataclass(frozen=True)
class Number:
    """A real number in [lo, hi] (or (lo, hi] when `lo_open`); ints are accepted as floats."""

    lo: float
    hi: float
    lo_open: bool = False

    def __call__(self, v: Any) -> float:
        """The value as a float, or `BadValue`."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise BadValue
        if (v <= self.lo if self.lo_open else v < self.lo) or v > self.hi:
            raise BadValue
        return float(v)


@dataclass(frozen=True)
class Integer:
    """An integer in [lo, hi] (bools refused)."""

    lo: int
    hi: int

    def __call__(self, v: Any) -> int:
        """The value, or `BadValue`."""
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            raise BadValue
        return v


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of strings."""

    options: tuple[str, ...]

    def __call__(self, v: Any) -> str:
        """The value, or `BadValue`."""
        if v not in self.options:
            raise BadValue
        return v


@dataclass(frozen=True)
class Text:
    """Any string (paths, addresses checked later by the command)."""

    def __call__(self, v: Any) -> str:
        """The value, or `BadValue`."""
        if not isinstance(v, str):
            raise BadValue
        return v


@dataclass(frozen=True)
class MultiaddrList:
    """A list of multiaddr strings (each starting with '/'); one string is a list of one."""

    def __call__(self, v: Any) -> tuple[str, ...]:
        """The value as a tuple, or `BadValue`."""
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list | tuple) or not all(
            isinstance(a, str) and a.startswith("/") for a in v
        ):
            raise BadValue
        return tuple(v)


Checker = Number | Integer | Choice | Text | MultiaddrList


@dataclass(frozen=True)
class Flag:
    """The `swarm-node start` flag of a key: its name, help, and how the value is read."""

    name: str
    help: str | None = None
    metavar: str | None = None
    path: bool = False  # a click.Path (its value passed on as a string)
    multiple: bool = False  # repeatable; the values form a list, none given: the file's
    click_min: bool = False  # click refuses a value under the key's lower bound (usage error)


@dataclass(frozen=True)
class Spec:
    """What a config field is: checker, allowed values in words, help, and its flag if any."""

    check: Checker
    allowed: str
    help: str = ""
    flag: Flag | None = None
    path: bool = False  # in a file, relative to the file


def setting(
    default: Any,
    check: Checker,
    allowed: str,
    help: str = "",
    *,
    flag: Flag | None = None,
    path: bool = False,
) -> Any:
    """A dataclass field of the config tree with its `Spec` in the field's metadata."""
    spec = Spec(check=check, allowed=allowed, help=help, flag=flag, path=path)
    return field(default=default, metadata={"spec": spec})


A_PATH = "a path"
NUMBER_0_600 = "a number in (0, 600]"


@dataclass(frozen=True)
class NodeSection:
    """`[node]`: who this process is and where it keeps its files."""

    role: str = setting(
        "inference",
        Choice(ROLES),
        " | ".join(ROLES),
        "what this process does",
        flag=Flag("--role", "What this node does (or node.role in --config; default inference)."),
    )
    key: str = setting(
        "",
        Text(),
        A_PATH,
        "identity key file (swarm-node keygen); required",
        flag=Flag("--key", "Identity key file (or node.key).", path=True),
        path=True,
    )
    run: str = setting(
        "",
        Text(),
        A_PATH,
        "run manifest TOML; required unless --join",
        flag=Flag("--run", "Run manifest TOML (or node.run).", path=True),
        path=True,
    )
    data_dir: str = setting(
        "",
        Text(),
        A_PATH,
        "this node's directory (see node.paths)",
        flag=Flag(
            "--data-dir",
            "This node's directory: store, status file, models/ (default <data root>/nodes/...).",
            path=True,
        ),
        path=True,
    )
    model: str = setting(
        "",
        Text(),
        "a path or empty",
        "model directory (default: the run's)",
        flag=Flag("--model", "Model directory or builtin:tiny (default: the manifest's model)."),
        path=True,
    )
    device: str = setting(
        "auto",
        Choice(("auto", "cpu", "cuda")),
        "auto | cpu | cuda",
        "where this role's model computes (auto: a CUDA GPU when torch sees one, else the CPU;"
        " cuda: GPU LOCAL_RANK, pick others with CUDA_VISIBLE_DEVICES)",
        flag=Flag("--device", "Where the role's model computes: auto, cpu or cuda (default auto)."),
    )
    threads: int = setting(
        0,
        Integer(0, 4096),
        "an integer in [0, 4096] (0: the cores available)",
        "torch CPU threads of this process (0: the cores this process may run on, shared"
        " among the trainer's --nproc ranks)",
        flag=Flag("--threads", "Torch CPU threads (default 0: the cores available)."),
    )
    listen: tuple[str, ...] = setting(
        ("/ip4/127.0.0.1/tcp/0",),
        MultiaddrList(),
        "multiaddrs like /ip4/127.0.0.1/tcp/4001",
        "addresses to listen on (TCP; port 0: any free port)",
        flag=Flag("--listen", "Multiaddr to listen on (repeatable).", multiple=True),
    )
    bootstrap: tuple[str, ...] = setting(
        (),
        MultiaddrList(),
        "multiaddrs ending in /p2p/<peer id>",
        "peers to join the network through",
        flag=Flag(
            "--bootstrap",
            "Multiaddr of a peer, ending in /p2p/<id> (repeatable).",
            multiple=True,
        ),
    )
    log_level: str = setting(
        "info",
        Choice(LOG_LEVELS),
        " | ".join(LOG_LEVELS),
        "the lowest level of the log lines written on stderr",
        flag=Flag("--log-level"),
    )
    log_format: str = setting(
        "text",
        Choice(("text", "json")),
        "text | json",
        "log lines on stderr: text, or one JSON object a line (ts, level, logger, msg)",
        flag=Flag(
            "--log-format",
            "Log lines on stderr: text, or one JSON object a line (or node.log_format).",
        ),
    )
    metrics: str = setting(
        "",
        Text(),
        "HOST:PORT or empty",
        "Prometheus endpoint (empty: none)",
        flag=Flag(
            "--metrics",
            "Serve Prometheus metrics at http://HOST:PORT/metrics (or node.metrics).",
            metavar="HOST:PORT",
        ),
    )


@dataclass(frozen=True)
class NetworkSection:
    """`[network]`: timeouts, message sizes and rates of the peer-to-peer host."""

    dial_timeout_s: float = setting(
        10.0,
        Number(0, 600, lo_open=True),
        NUMBER_0_600,
        "seconds one connect (TCP, Noise, Yamux, protocol negotiation) may take",
    )
    io_timeout_s: float = setting(
        10.0,
        Number(0, 600, lo_open=True),
        NUMBER_0_600,
        "deadline in seconds on every read and write of a stream",
    )
    heartbeat_interval_s: float = setting(
        1.0,
        Number(0, 60, lo_open=True),
        "a number in (0, 60]",
        "seconds between application pings to each peer",
    )
    heartbeat_timeout_s: float = setting(
        6.0,
        Number(0, 600, lo_open=True),
        NUMBER_0_600,
        "a silent peer is dropped after this many seconds (more than heartbeat_interval_s)",
    )
    max_message_bytes: int = setting(
        1_000_000,
        Integer(1024, 1_000_000),
        "an integer in [1024, 1000000]",
        "largest gossip message sent or accepted; a larger one is refused",
    )
    publish_rate_per_s: float = setting(
        8.0,
        Number(0, 10, lo_open=True),
        "a number in (0, 10]",
        "gossip messages this node publishes per second at most",
    )
    header_batch: int = setting(
        32,
        Integer(1, 64),
        "an integer in [1, 64]",
        "signed rollout headers per gossip message at most (1: no batching)",
    )
    max_peers: int = setting(
        64, Integer(1, 10_000), "an integer in [1, 10000]", "peers this node keeps track of"
    )
    upload_limit_mib_s: float = setting(
        0.0,
        Number(0, 100_000),
        "a number in [0, 100000] (0: no cap)",
        "cap on weight shard uploads, MiB/s for all peers together",
        flag=Flag("--upload-limit", "Weight shard upload cap, MiB/s (0: none)."),
    )


@dataclass(frozen=True)
class WeightsSection:
    """`[weights]`: policy versions this node downloads and publishes."""

    max_version_mib: float = setting(
        16384.0,
        Number(0, 10_000_000, lo_open=True),
        "a number in (0, 10000000]",
        "refuse a policy version larger than this before downloading it",
    )
    shard_mib: float = setting(
        64.0,
        Number(0.0625, 64),
        "a number in [0.0625, 64]",
        "shard size this node cuts when it publishes versions (trainer)",
    )


@dataclass(frozen=True)
class TrainerSection:
    """`[trainer]`: the trainer role."""

    publish_every_s: float = setting(
        0.0,
        Number(0, 86_400),
        "a number in [0, 86400] (0: never)",
        "until training lands: publish perturbed weights every this many seconds",
        flag=Flag("--publish-every", "Trainer: publish perturbed weights every S seconds."),
    )
    micro_batch: int = setting(
        8,
        Integer(1, 4096),
        "an integer in [1, 4096]",
        "sequences per forward/backward pass; gradients accumulate into one step",
        flag=Flag(
            "--micro-batch",
            "Trainer: sequences per forward/backward pass of a step (default 8).",
            click_min=True,
        ),
    )

    nproc: int = setting(
        1,
        Integer(1, 1024),
        "an integer in [1, 1024]",
        "training ranks on this machine (torch.distributed DDP): this process is rank 0 and"
        " starts the others (gloo on a CPU, NCCL on GPUs); under torchrun leave it 1",
        flag=Flag(
            "--nproc", "Trainer: training ranks on this machine (DDP; default 1).", click_min=True
        ),
    )


@dataclass(frozen=True)
class InferenceSection:
    """`[inference]`: the inference role (rollout production)."""

    batch_size: int = setting(
        8,
        Integer(1, 4096),
        "an integer in [1, 4096]",
        "rollouts generated together in one batch",
        flag=Flag("--batch-size", "Inference batch size."),
    )
    rollouts_per_version: int = setting(
        0,
        Integer(0, 1_000_000),
        "an integer >= 0 (0: no bound)",
        "rollouts made per policy version the trainer publishes, at most max_staleness - 1 "
        "versions ahead",
        flag=Flag(
            "--rollouts-per-version",
            "Inference: make at most this many rollouts per published version (0: no bound).",
        ),
    )
    engine: str = setting(
        "hf",
        Choice(("hf", "vllm")),
        "hf | vllm",
        "generation engine",
        flag=Flag("--engine", "Inference: generation engine (default hf)."),
    )


@dataclass(frozen=True)
class ValidatorSection:
    """`[validator]`: the validator role (audits)."""

    audit_fraction: float = setting(
        0.25,
        Number(0, 1),
        "a number in [0, 1]",
        "share of the rollouts seen that this validator audits",
        flag=Flag("--audit-fraction", "Validator: share of rollouts to audit."),
    )
    producer_window_fraction: float = setting(
        0.0625,
        Number(0, 1),
        "a number in [0, 1]",
        "share of each producer's windows of 16 records audited whole (per-producer evidence)",
    )


RELAY_LIMIT = "an integer in [1, 100000]"


@dataclass(frozen=True)
class RelaySection:
    """`[relay]`: the relay service's limits (`--role relay`; the defaults are those of
    `node.host.relay.RelayLimitsConfig`). `--relay-limit NAME=N` sets any of them."""

    max_reservations: int = setting(
        128,
        Integer(1, 100_000),
        RELAY_LIMIT,
        "peers holding a relay slot at once (one per peer id)",
    )
    max_reservations_per_ip: int = setting(
        8, Integer(1, 100_000), RELAY_LIMIT, "of those, from one IP address"
    )
    max_circuits_per_peer: int = setting(
        8,
        Integer(1, 1024),
        "an integer in [1, 1024]",
        "live relayed connections to one peer holding a slot",
    )
    max_circuit_bytes: int = setting(
        256 * 1024**2,
        Integer(1024, 2**40),
        "an integer of bytes in [1024, 2^40]",
        "bytes one relayed connection may carry, both directions",
    )
    max_circuit_s: int = setting(
        1800,
        Integer(1, 7 * 86_400),
        "an integer in [1, 604800]",
        "seconds one relayed connection may last",
    )
    reservation_ttl_s: int = setting(
        3600,
        Integer(10, 7 * 86_400),
        "an integer in [10, 604800]",
        "a slot lasts this long unless the peer refreshes it",
    )


@dataclass(frozen=True)
class StoreSection:
    """`[store]`: the node's SQLite store."""

    max_bytes: int = setting(
        4 * 1024**3,
        Integer(1_000_000, 2**50),
        "an integer of bytes in [1000000, 2^50]",
        "the store prunes to stay under this (never our own unacknowledged work, scores, bans)",
    )


@dataclass(frozen=True)
class NodeConfig:
    """The whole node configuration: one attribute per TOML section.

    Read typed (`cfg.network.io_timeout_s`) or by dotted key (`cfg["network.io_timeout_s"]`).
    """

    node: NodeSection = field(default_factory=NodeSection)
    network: NetworkSection = field(default_factory=NetworkSection)
    weights: WeightsSection = field(default_factory=WeightsSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    inference: InferenceSection = field(default_factory=InferenceSection)
    validator: ValidatorSection = field(default_factory=ValidatorSection)
    relay: RelaySection = field(default_factory=RelaySection)
    store: StoreSection = field(default_factory=StoreSection)

    def __getitem__(self, name: str) -> Any:
        """The value of a dotted key, like `network.io_timeout_s`."""
        section, _, key = name.partition(".")
        if section not in SECTIONS or key not in _fields_of(section):
            raise KeyError(name)
        return getattr(getattr(self, section), key)


@dataclass(frozen=True)
class Key:
    """One configuration key, flattened from the tree: dotted name, default, checker,
    allowed values in words, help, and its `start` flag if any."""

    name: str
    default: Any
    check: Checker
    allowed: str
    help: str = ""
    flag: Flag | None = None
    path: bool = False


SECTIONS: dict[str, type] = {
    "node": NodeSection,
    "network": NetworkSection,
    "weights": WeightsSection,
    "trainer": TrainerSection,
    "inference": InferenceSection,
    "validator": ValidatorSection,
    "relay": RelaySection,
    "store": StoreSection,
}


def _fields_of(section: str) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


def _keys() -> tuple[Key, ...]:
    out = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            spec: Spec = f.metadata["spec"]
            out.append(
                Key(
                    name=f"{section}.{f.name}",
                    default=f.default,
                    check=spec.check,
                    allowed=spec.allowed,
                    help=spec.help,
                    flag=spec.flag,
                    path=spec.path,
                )
            )
    return tuple(out)


NODE_KEYS: tuple[Key, ...] = _keys()
PATH_KEYS = tuple(k.name for k in NODE_KEYS if k.path)


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
    sections = sorted(SECTIONS)
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


def load_config(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> NodeConfig:
    """Defaults, then the TOML file (if given), then `overrides` (dotted keys, from flags;
    None values skipped); every value checked, the result a `NodeConfig`."""
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
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for name, value in raw.items():
        key = known.get(name)
        if key is None:
            section = name.split(".")[0]
            options = [k for k in known if k.startswith(section + ".")] or list(known)
            raise CommandError(f"unknown config key {name!r}; allowed: {', '.join(options)}")
        try:
            section, _, field_name = name.partition(".")
            values[section][field_name] = key.check(value)
        except BadValue:
            raise CommandError(f"{name}: expected {key.allowed}, got {value!r}") from None
    cfg = NodeConfig(**{s: cls(**values[s]) for s, cls in SECTIONS.items()})
    _check_relations(cfg)
    return cfg


def _check_relations(cfg: NodeConfig) -> None:
    """Bounds between keys: a heartbeat timeout above its interval, per-IP reservations
    at most all reservations."""
    net, relay = cfg.network, cfg.relay
    if net.heartbeat_timeout_s <= net.heartbeat_interval_s:
        raise CommandError(
            "network.heartbeat_timeout_s: expected more than network.heartbeat_interval_s"
            f" ({net.heartbeat_interval_s}), got {net.heartbeat_timeout_s}"
        )
    if relay.max_reservations_per_ip > relay.max_reservations:
        raise CommandError(
            "relay.max_reservations_per_ip: expected at most relay.max_reservations"
            f" ({relay.max_reservations}), got {relay.max_reservations_per_ip}"
        )


# --- command-line flags ----------------------------------------------------------------


def _click_type(key: Key) -> Any:
    spec = key.flag
    assert spec is not None
    if spec.path:
        return click.Path(path_type=Path)
    if isinstance(key.check, Choice):
        return click.Choice(list(key.check.options))
    if isinstance(key.check, Integer):
        return click.IntRange(min=key.check.lo) if spec.click_min else int
    if isinstance(key.check, Number):
        return float
    return None


RELAY_LIMIT_FLAG = Flag(
    "--relay-limit",
    "Role relay: one of the [relay] limits, like max_reservations=64 (repeatable).",
    metavar="NAME=N",
    multiple=True,
)


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per config key that has a `Flag` (type from
    the checker, help from the flag, default None: the file's or the tree's default wins),
    and `--relay-limit NAME=N` for the `[relay]` keys. `flag_overrides` turns the parsed
    values back into dotted config overrides."""
    fn = click.option(
        RELAY_LIMIT_FLAG.name,
        "relay_limit",
        multiple=True,
        metavar=RELAY_LIMIT_FLAG.metavar,
        help=RELAY_LIMIT_FLAG.help,
    )(fn)
    for key in reversed([k for k in NODE_KEYS if k.flag is not None]):
        spec = key.flag
        assert spec is not None
        fn = click.option(
            spec.name,
            _param_name(key),
            type=_click_type(key),
            multiple=spec.multiple,
            metavar=spec.metavar,
            help=_flag_help(key),
        )(fn)
    return fn


def _flag_help(key: Key) -> str | None:
    """The flag's help, with the bounds of a numeric key."""
    assert key.flag is not None
    if isinstance(key.check, Number | Integer):
        return f"{key.flag.help or key.help} [{key.allowed}]"
    return key.flag.help


def _param_name(key: Key) -> str:
    assert key.flag is not None
    return key.flag.name.lstrip("-").replace("-", "_")


def flag_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """Pop the values of the flags `config_options` added out of a click callback's keyword
    arguments, as dotted config overrides (None: not given)."""
    out: dict[str, Any] = {}
    for key in NODE_KEYS:
        if key.flag is None:
            continue
        value = params.pop(_param_name(key), None)
        if key.flag.multiple:
            value = list(value) if value else None
        elif key.flag.path and value is not None:
            value = str(value)
        out[key.name] = value
    out.update(parse_relay_limits(params.pop("relay_limit", ())))
    return out


def parse_relay_limits(items: Sequence[str]) -> dict[str, Any]:
    """`--relay-limit NAME=INTEGER` flags as config overrides (`relay.NAME`)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[f"relay.{name.strip()}"] = int(value)
        except ValueError:
            raise CommandError(
                f"--relay-limit: expected NAME=INTEGER (like max_reservations=64), got {item!r}"
            ) from None
    return out


# --- the reference -----------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def reference_markdown() -> str:
    """The configuration reference (docs/CONFIG.md): every section and key with its
    default, allowed values, help and `swarm-node start` flag."""
    lines = [
        "# Node configuration reference",
        "",
        "Generated from `node/config.py` by `python -m node.config > docs/CONFIG.md`; do not edit.",
        "",
        "`swarm-node start --config FILE.toml` reads these keys; a flag, where one is named,",
        "overrides the file. Paths in the file are relative to the file. Unknown sections and",
        "keys are errors.",
    ]
    for section, cls in SECTIONS.items():
        doc = " ".join((cls.__doc__ or "").split())
        lines += [
            "",
            f"## [{section}]",
            "",
            doc,
            "",
            "| key | default | allowed | flag | meaning |",
        ]
        lines.append("|---|---|---|---|---|")
        for key in NODE_KEYS:
            if not key.name.startswith(section + "."):
                continue
            flag = f"`{key.flag.name}`" if key.flag else ""
            if section == "relay":
                flag = f"`--relay-limit {key.name.split('.')[1]}=N`"
            cells = [
                f"`{key.name.split('.', 1)[1]}`",
                f"`{_toml_value(key.default)}`",
                key.allowed.replace("|", "\\|"),
                flag,
                (key.help or (key.flag.help if key.flag and key.flag.help else "")).replace(
                    "|", "\\|"
                ),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
