"""The verify tests' shared world: a micro random policy saved as a model directory, a run
manifest, a fixed producer key and six honest records made by `swarm-node rollouts`.

`tests/conftest.py` serves it as the module-scoped fixture `env`: each test module that
asks for it gets its own copy, built once for the module. `records_file` and
`open_records_file` make more records in that world (another model, another claimed
version); `rank1_change` makes the cheater's model of the sensitivity tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.commands import rollouts
from node.keyfile import write_key
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.rollout import open_record, read_records
from trainer.engine_hf import HFEngine
from trainer.judge import make_judge
from trainer.model_dir import save_model_dir
from trainer.produce import generate_records
from trainer.tasks import TaskSet
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table
from verify import toploc
from verify.auditor import AuditSettings


def build_audit_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("audit")
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=3,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model_dir = save_model_dir(model, tok, root / "model")
    table = run_manifest_table(run_id="audit-test", seed=9)
    table["sampling"]["max_new_tokens"] = 40  # two proof chunks when no EOS comes
    run = root / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    key = root / "key.pem"
    # A fixed key: tasks and seeds follow from the producer's id, so the records (and an
    # edited token's outcome) are the same on every run.
    identity = Identity.from_private_bytes(content_id(b"test-verify-audit"))
    write_key(key, identity)
    out = root / "honest.msgpack"
    rollouts.main(run=run, key=key, n=6, out=out, model=str(model_dir), batch_size=6, quiet=True)
    with open(out, "rb") as f:
        records = list(read_records(f))
    manifest = load_run_manifest(run)
    return dict(
        root=root,
        tok=tok,
        model=model,
        model_dir=model_dir,
        run=run,
        identity=identity,
        records=records,
        opened=[open_record(r) for r in records],
        manifest=manifest,
        judge=make_judge(manifest, tok),
        tasks=TaskSet(manifest.seed),
        settings=AuditSettings(expected_settings=manifest),
    )


def records_file(
    env: dict[str, Any],
    model: Any,
    name: str,
    *,
    n: int = 8,
    max_batch: int | None = None,
    start_counter: int = 0,
    policy_version: int = 0,
) -> Path:
    """`n` records of `env`'s producer made with `model` (proofs included), written to
    `env["root"] / name`."""
    out = env["root"] / name
    generate_records(
        engine=HFEngine(model, env["tok"], max_batch=max_batch or n),
        manifest=env["manifest"],
        identity=env["identity"],
        n=n,
        out=out,
        policy_version=policy_version,
        start_counter=start_counter,
        build_proofs=toploc.build_proofs_bytes_many,
    )
    return out


def open_records_file(path: Path) -> list[Any]:
    """The records of a file, opened (`protocol.rollout.open_record`)."""
    with open(path, "rb") as f:
        return [open_record(r) for r in read_records(f)]


def rank1_change(model: Any, rel: float, layer: int = 0, seed: int = 0) -> Any:
    """A copy of `model` with a rank-1 change of relative Frobenius size `rel` to one
    layer's down_proj."""
    import copy

    m = copy.deepcopy(model)
    w = m.base_model.layers[layer].mlp.down_proj.weight
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(w.shape[0], 1, generator=g), torch.randn(1, w.shape[1], generator=g)
    with torch.no_grad():
        w.add_(u @ v * (rel * w.norm() / (u @ v).norm()))
    return m
