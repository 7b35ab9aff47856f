"""The verify tests' shared world: a micro random policy saved as a model directory, a run
manifest, a fixed producer key and six honest records made by `swarm-node rollouts`.

`tests/conftest.py` serves it as the module-scoped fixture `env`: each test module that
asks for it gets its own copy, built once for the module."""

from __future__ import annotations

from typing import Any

import pytest

from node.commands import rollouts
from node.keyfile import write_key
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.rollout import open_record, read_records
from trainer.judge import make_judge
from trainer.model_dir import save_model_dir
from trainer.tasks import TaskSet
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table
from verify.auditor import AuditSettings


def build_audit_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("audit")
    tok = build_tokenizer(seed=0)
    model = build_model(
        tok, seed=3, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
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
        root=root, tok=tok, model=model, model_dir=model_dir, run=run, identity=identity,
        records=records, opened=[open_record(r) for r in records], manifest=manifest,
        judge=make_judge(manifest, tok), tasks=TaskSet(manifest.seed),
        settings=AuditSettings(expected_settings=manifest),
    )
