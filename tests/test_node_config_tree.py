"""The configuration tree is the one declaration of every key: the committed reference
docs/CONFIG.md is what the generator writes, `start`'s flags are the tree's, and the
settings objects carry the tree's values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from node.commands.start import command as start_command
from node.config import NODE_KEYS, SECTIONS, NodeConfig, load_config, reference_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_reference_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "CONFIG.md").read_text()
    assert committed == reference_markdown(), (
        "docs/CONFIG.md is stale: run `python -m node.config > docs/CONFIG.md`"
    )


def test_every_key_has_help_and_every_section_a_docstring() -> None:
    for key in NODE_KEYS:
        assert key.help, key.name
    for cls in SECTIONS.values():
        assert cls.__doc__ and dataclasses.is_dataclass(cls)


def test_the_tree_defaults_are_the_loaded_defaults_and_read_by_dotted_name() -> None:
    cfg = load_config()
    assert cfg == NodeConfig()
    for key in NODE_KEYS:
        assert cfg[key.name] == key.default


def test_each_flagged_key_is_one_start_option_that_defers_to_the_file() -> None:
    from node.config import flag_overrides

    options = {opt: p for p in start_command.params for opt in p.opts}
    for key in NODE_KEYS:
        if key.flag is not None:
            assert options[key.flag.name].multiple == key.flag.multiple, key.name
    params = dict(start_command.make_context("start", []).params)
    overrides = flag_overrides(params)
    assert {k.name for k in NODE_KEYS if k.flag} <= set(overrides)
    assert all(v is None for v in overrides.values())  # not given: the file's value wins


def test_flags_override_the_file(tmp_path: Path) -> None:
    from node.config import flag_overrides

    conf = tmp_path / "node.toml"
    conf.write_text('[inference]\nbatch_size = 4\n[node]\nlisten = ["/ip4/0.0.0.0/tcp/1"]\n')
    ctx = start_command.make_context(
        "start", ["--config", str(conf), "--batch-size", "7", "--relay-limit", "max_circuit_s=9"]
    )
    params = dict(ctx.params)
    cfg = load_config(params.pop("config"), flag_overrides(params))
    assert cfg.inference.batch_size == 7
    assert cfg.node.listen == ("/ip4/0.0.0.0/tcp/1",)
    assert cfg.relay.max_circuit_s == 9
    assert set(params) == {
        "max_rollouts",
        "local_train",
        "duration",
        "join",
        "authority",
    }


def test_the_settings_objects_carry_the_tree(tmp_path: Path) -> None:
    from node.settings import host_settings, weight_settings

    conf = tmp_path / "node.toml"
    conf.write_text(
        "[network]\nio_timeout_s = 3\nheartbeat_timeout_s = 9\n[weights]\nshard_mib = 1\n"
    )
    cfg = load_config(conf)
    host = host_settings(cfg)
    assert (host.io_timeout_s, host.peer_dead_after_s) == (3.0, 9.0)
    assert weight_settings(cfg).shard_bytes == 2**20
