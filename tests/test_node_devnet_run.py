"""The devnet's copy of a run file given with `--run`: its own trainer and validators may
publish and judge whatever keys the file names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from node.commands.devnet import _node_key, _write_run
from node.run_file import manifest_from_table, manifest_to_toml
from protocol.identity import Identity, peer_id_to_b58
from trainer import tiny_policy


def test_a_run_file_naming_other_validators_still_counts_the_devnets_own(tmp_path: Path) -> None:
    manifest = manifest_from_table(tiny_policy.run_manifest_table("devnet"))
    other = Identity.generate().peer_id

    src = tmp_path / "given.toml"
    src.write_text(
        manifest_to_toml(
            dataclasses.replace(manifest, validator_keys=(other,), trainer_keys=(other,))
        )
    )
    root = tmp_path / "out"
    written, path = _write_run(src, root, validators=2)
    mine = [_node_key(root, f"validator{i + 1}").peer_id for i in range(2)]
    assert all(k in written.validator_keys for k in mine), written.validator_keys
    assert other in written.validator_keys  # the file's own validators keep their say
    assert _node_key(root, "trainer").peer_id in written.trainer_keys
    assert path.read_text().count(peer_id_to_b58(mine[0])) == 1
