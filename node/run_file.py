"""The run manifest as a TOML file: read it into a `protocol.wire.RunManifest`.

```toml
[run]
id = "demo"                 # lowercase letters, digits, - _ .
model = "builtin:tiny"      # or a path / name of a Hugging Face model directory
model_digest = ""           # optional: 64 hex chars, the content id of the weights
model_files_digest = ""     # optional: 64 hex chars, the content id of the model's other
                            # files (config, tokenizer); joiners fetch them from the run
seed = 1234
group_size = 8              # rollouts per task for group-relative advantages
max_staleness = 2           # a rollout of version v is usable at version t if t - v <= this
trainer_keys = []           # peer ids allowed to publish new policy versions
snapshot_every = 8          # weights: a full snapshot every K versions (joiners start there)
validator_keys = []         # peer ids whose verdicts count (trainer keys may delegate more)
verdict_quorum = 1          # distinct passing validators that make a rollout verified

[sampling]
max_new_tokens = 48
temperature = 1.0
top_p = 1.0
top_k = 0                   # 0 = off

[proofs]
chunk = 32
topk = 128

[rl]                        # the trainer's loss and loop (trainer/loss.py has the math)
advantage = "mean"          # "mean": r - mean(r); "std": (r - mean) / (std + eps)
aggregation = "token"       # "token" mean over the batch, or "sequence" mean of means
clip_low = 0.2              # PPO clip band [1 - clip_low, 1 + clip_high]
clip_high = 0.28
is_bound = 2.0              # truncated importance weight min(pi_old / pi_sampler, C); 0 = off
kl_coef = 0.0               # weight of the KL to the starting policy; 0 = none
lr = 0.0003                 # AdamW learning rate
groups_per_step = 16        # groups of group_size rollouts per optimiser step
publish_every = 64          # verified groups trained on per published version

[verification]
precision = "fp32"          # the workers' compute precision: fp32 or bf16; audits judge at it only
calibration_digest = ""     # optional: 64 hex chars, the content id of the model's calibration.json

[weights]                   # optional section
dtype = "float32"           # published policy versions: "float32" (the trainer's fp32 master as
                            # held) or "bfloat16" (cast from the master at each publish: half
                            # the bytes, and a small step leaves most bf16 values unchanged)

[[datasets]]
name = "basic_arithmetic"
weight = 1

[release]                   # written by `swarm-node run sign`: the run authority's signature
version = 1                 # each update of the run gets a higher one
authority = "12D3KooW..."   # the authority's peer id (its key signs every release)
signed_at_ms = 1700000000000
signature = "..."           # 128 hex chars over the manifest above and these fields
```

A run file with a `[release]` section is a signed release (`load_run_release`): editing
the manifest after signing breaks the signature, and the file is refused until signed again.

Errors are one line and name the TOML key (`sampling.top_p: 1.5 out of range [0.0, 1.0]`).
Which datasets a run may use (refusing gameable scorers) is the task adapter's rule in
`trainer.tasks`; this module only checks the shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.config import read_toml
from node.errors import CommandError
from protocol import run_manifest as rm
from protocol.errors import LocalProtocolError
from protocol.identity import peer_id_from_b58, peer_id_to_b58
from protocol.wire import DatasetSpec, RunManifest

# RunManifest field -> (TOML section, key, default or REQUIRED)
REQUIRED = object()
FIELDS: dict[str, tuple[str, str, Any]] = {
    "run_id": ("run", "id", REQUIRED),
    "model": ("run", "model", "builtin:tiny"),
    "model_digest": ("run", "model_digest", ""),
    "model_files_digest": ("run", "model_files_digest", ""),
    "seed": ("run", "seed", 0),
    "group_size": ("run", "group_size", 8),
    "max_staleness": ("run", "max_staleness", 2),
    "trainer_keys": ("run", "trainer_keys", []),
    "snapshot_every": ("run", "snapshot_every", 8),
    "validator_keys": ("run", "validator_keys", []),
    "verdict_quorum": ("run", "verdict_quorum", 1),
    "max_new_tokens": ("sampling", "max_new_tokens", 48),
    "temperature": ("sampling", "temperature", 1.0),
    "top_p": ("sampling", "top_p", 1.0),
    "top_k": ("sampling", "top_k", 0),
    "proof_chunk": ("proofs", "chunk", 32),
    "proof_topk": ("proofs", "topk", 128),
    "rl_advantage": ("rl", "advantage", "mean"),
    "rl_aggregation": ("rl", "aggregation", "token"),
    "rl_clip_low": ("rl", "clip_low", 0.2),
    "rl_clip_high": ("rl", "clip_high", 0.28),
    "rl_is_bound": ("rl", "is_bound", 2.0),
    "rl_kl_coef": ("rl", "kl_coef", 0.0),
    "rl_lr": ("rl", "lr", 3e-4),
    "rl_groups_per_step": ("rl", "groups_per_step", 16),
    "rl_publish_every": ("rl", "publish_every", 64),
    "worker_precision": ("verification", "precision", "fp32"),
    "calibration_digest": ("verification", "calibration_digest", ""),
    "weights_dtype": ("weights", "dtype", "float32"),
}
FLOAT_FIELDS = {"temperature", "top_p", "rl_clip_low", "rl_clip_high", "rl_is_bound"}
FLOAT_FIELDS |= {"rl_kl_coef", "rl_lr"}
TABLES = ("run", "sampling", "proofs", "rl", "verification", "weights")
SECTIONS = {*TABLES, "datasets", "release"}
RELEASE_KEYS = {"version": int, "authority": str, "signed_at_ms": int, "signature": str}


def _key_of(field: str) -> str:
    if field == "datasets":
        return "datasets"
    section, key, _ = FIELDS[field]
    return f"{section}.{key}"


def manifest_from_table(table: dict[str, Any], source: str = "run manifest") -> RunManifest:
    """Build a RunManifest from a parsed TOML table; one-line `CommandError` on any problem."""
    for section in table:
        if section not in SECTIONS:
            raise CommandError(
                f"{source}: unknown section [{section}]; allowed: {', '.join(sorted(SECTIONS))}"
            )
    for section in TABLES:
        if not isinstance(table.get(section, {}), dict):
            raise CommandError(f"{source}: '{section}' must be a table [{section}]")
        known = {key for s, key, _ in FIELDS.values() if s == section}
        for key in table.get(section, {}):
            if key not in known:
                raise CommandError(
                    f"{source}: unknown key {section}.{key}; allowed: {', '.join(sorted(known))}"
                )
    kwargs: dict[str, Any] = {}
    for field, (section, key, default) in FIELDS.items():
        value = table.get(section, {}).get(key, default)
        if value is REQUIRED:
            raise CommandError(f"{source}: missing required key {section}.{key}")
        if field in FLOAT_FIELDS and type(value) is int:
            value = float(value)
        kwargs[field] = value
    for name in ("model_digest", "model_files_digest"):
        try:
            kwargs[name] = bytes.fromhex(kwargs[name])
        except (TypeError, ValueError):
            raise CommandError(f"{source}: run.{name}: expected 64 hex characters") from None
    try:
        kwargs["calibration_digest"] = bytes.fromhex(kwargs["calibration_digest"])
    except (TypeError, ValueError):
        raise CommandError(
            f"{source}: verification.calibration_digest: expected 64 hex characters"
        ) from None
    for name in ("trainer_keys", "validator_keys"):
        kwargs[name] = _peer_ids(kwargs[name], f"{source}: run.{name}")
    datasets = table.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise CommandError(f"{source}: at least one [[datasets]] entry (name, weight) is required")
    specs = []
    for i, entry in enumerate(datasets):
        if not isinstance(entry, dict) or set(entry) - {"name", "weight"} or "name" not in entry:
            raise CommandError(
                f"{source}: datasets[{i}]: expected keys name (string) and weight (integer)"
            )
        try:
            specs.append(DatasetSpec(name=entry["name"], weight=entry.get("weight", 1)))
        except LocalProtocolError as exc:
            raise CommandError(f"{source}: datasets[{i}]: {_problem(exc)}") from None
    kwargs["datasets"] = tuple(specs)
    try:
        return RunManifest(**kwargs)
    except LocalProtocolError as exc:
        field = str(exc).split(":")[0].split(".")[-1]
        key = _key_of(field) if field in FIELDS else field
        raise CommandError(f"{source}: {key}: {_problem(exc)}") from None


def _peer_ids(keys: Any, where: str) -> tuple[bytes, ...]:
    """A TOML list of base58 peer ids as raw peer ids; one-line `CommandError` otherwise."""
    if not isinstance(keys, list):
        raise CommandError(f"{where}: expected a list of peer ids")
    if not all(isinstance(k, str) for k in keys):
        raise CommandError(f"{where}: expected strings")
    try:
        return tuple(peer_id_from_b58(k) for k in keys)
    except LocalProtocolError as exc:
        raise CommandError(f"{where}: {exc}") from None


def _problem(exc: Exception) -> str:
    return str(exc).split(": ", 1)[-1]


def load_run_manifest(path: Path) -> RunManifest:
    """Read and validate a run manifest TOML file."""
    return manifest_from_table(read_toml(path, "run manifest"), source=str(path))


def load_run_release(path: Path) -> tuple[RunManifest, bytes | None]:
    """A run file's manifest and, when it has a `[release]` section, the signed release
    envelope (checked: a release that does not verify is a one-line `CommandError`)."""
    table = read_toml(path, "run manifest")
    manifest = manifest_from_table(table, source=str(path))
    section = table.get("release")
    if section is None:
        return manifest, None
    if (
        not isinstance(section, dict)
        or set(section) != set(RELEASE_KEYS)
        or not all(type(section[k]) is kind for k, kind in RELEASE_KEYS.items())
    ):
        raise CommandError(
            f"{path}: [release] needs exactly {', '.join(RELEASE_KEYS)}; "
            "sign the file again with `swarm-node run sign`"
        )
    try:
        data = rm.assemble(
            manifest,
            section["version"],
            peer_id_from_b58(section["authority"]),
            section["signed_at_ms"],
            bytes.fromhex(section["signature"]),
        )
    except (LocalProtocolError, ValueError) as exc:
        raise CommandError(f"{path}: [release]: {_problem(exc)}") from None
    verdict = rm.check(data, None, None)
    if isinstance(verdict, rm.Refuse):
        raise CommandError(
            f"{path}: the run authority's signature does not verify ({verdict}): "
            "was the file edited after signing? sign it again with `swarm-node run sign`"
        )
    return manifest, data


def release_to_toml(data: bytes) -> str:
    """The `[release]` section of a signed release's envelope bytes."""
    version, authority, signed_at_ms, signature = rm.parts(data)
    return (
        "\n".join(
            [
                "[release]",
                f"version = {version}",
                f'authority = "{peer_id_to_b58(authority)}"',
                f"signed_at_ms = {signed_at_ms}",
                f'signature = "{signature.hex()}"',
            ]
        )
        + "\n"
    )


def manifest_to_toml(m: RunManifest) -> str:
    """The TOML text of a manifest (what `load_run_manifest` reads back to an equal object)."""
    keys = ", ".join(f'"{peer_id_to_b58(k)}"' for k in m.trainer_keys)
    validators = ", ".join(f'"{peer_id_to_b58(k)}"' for k in m.validator_keys)
    lines = [
        "[run]",
        f'id = "{m.run_id}"',
        f'model = "{m.model}"',
        f'model_digest = "{m.model_digest.hex()}"',
        *([f'model_files_digest = "{m.model_files_digest.hex()}"'] if m.model_files_digest else []),
        f"seed = {m.seed}",
        f"group_size = {m.group_size}",
        f"max_staleness = {m.max_staleness}",
        f"trainer_keys = [{keys}]",
        f"snapshot_every = {m.snapshot_every}",
        f"validator_keys = [{validators}]",
        f"verdict_quorum = {m.verdict_quorum}",
        "",
        "[sampling]",
        f"max_new_tokens = {m.max_new_tokens}",
        f"temperature = {m.temperature!r}",
        f"top_p = {m.top_p!r}",
        f"top_k = {m.top_k}",
        "",
        "[proofs]",
        f"chunk = {m.proof_chunk}",
        f"topk = {m.proof_topk}",
        "",
        "[rl]",
        f'advantage = "{m.rl_advantage}"',
        f'aggregation = "{m.rl_aggregation}"',
        f"clip_low = {m.rl_clip_low!r}",
        f"clip_high = {m.rl_clip_high!r}",
        f"is_bound = {m.rl_is_bound!r}",
        f"kl_coef = {m.rl_kl_coef!r}",
        f"lr = {m.rl_lr!r}",
        f"groups_per_step = {m.rl_groups_per_step}",
        f"publish_every = {m.rl_publish_every}",
        "",
        "[verification]",
        f'precision = "{m.worker_precision}"',
        f'calibration_digest = "{m.calibration_digest.hex()}"',
    ]
    if m.weights_dtype != "float32":  # the default stays unwritten, like on the wire
        lines += ["", "[weights]", f'dtype = "{m.weights_dtype}"']
    for d in m.datasets:
        lines += ["", "[[datasets]]", f'name = "{d.name}"', f"weight = {d.weight}"]
    return "\n".join(lines) + "\n"
