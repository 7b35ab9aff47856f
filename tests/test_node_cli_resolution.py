"""One resolution of data directory, key, run file and model for every command: config keys
honoured (paths relative to the config file), README defaults equal to the code's, `audit
--data-dir`, `status` finding what `start` wrote, messages naming the real flags."""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path

import pytest

from node.config import NODE_KEYS
from node.keyfile import write_key
from node.run_file import manifest_to_toml
from node.testing.records import net_manifest
from protocol.identity import Identity
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent


cli = functools.partial(run_cli, timeout=180)


def test_readme_config_defaults_are_the_code_defaults():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Configuration.*?```toml\n(.*?)```", text, re.S)
    assert block, "README has a Configuration section with a TOML block"
    table = tomllib.loads(block.group(1))
    documented = {f"{s}.{k}": v for s, body in table.items() for k, v in body.items()}
    code = {k.name: k.default for k in NODE_KEYS}
    assert set(documented) == set(code)
    for name, default in code.items():
        value = documented[name]
        if isinstance(default, tuple):
            value = tuple(value)
        assert value == default, (name, value, default)


@pytest.fixture
def node_files(tmp_path: Path) -> Path:
    write_key(tmp_path / "my.key", Identity.generate())
    (tmp_path / "my-run.toml").write_text(manifest_to_toml(net_manifest("resolve-test")))
    return tmp_path


@pytest.mark.slow
def test_start_takes_role_key_run_and_data_dir_from_the_config_file(node_files: Path):
    cfg = node_files / "node.toml"
    cfg.write_text(
        '[node]\nrole = "relay"\nkey = "my.key"\nrun = "my-run.toml"\ndata_dir = "relay-data"\n'
    )
    elsewhere = node_files / "elsewhere"
    elsewhere.mkdir()
    res = cli("start", "--config", str(cfg), "--duration", "2", cwd=elsewhere)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "role relay, run 'resolve-test'" in res.stdout
    assert (node_files / "relay-data" / "status.json").is_file()


def test_start_uses_the_config_model(node_files: Path):
    cfg = node_files / "node.toml"
    cfg.write_text(
        '[node]\nrole = "inference"\nkey = "my.key"\nrun = "my-run.toml"\nmodel = "no-such-model"\n'
    )
    res = cli("start", "--config", str(cfg), "--duration", "2")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert str(node_files / "no-such-model") in res.stderr, res.stderr


def test_start_without_key_names_the_flag_and_the_config_key(node_files: Path):
    res = cli("start", "--role", "relay", "--run", str(node_files / "my-run.toml"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--key" in res.stderr and "node.key" in res.stderr


@pytest.mark.slow
def test_status_without_flags_finds_the_node_start_wrote(node_files: Path):
    env = {"SWARM_NODE_DATA": str(node_files / "root")}
    res = cli(
        "start",
        "--role",
        "relay",
        "--run",
        str(node_files / "my-run.toml"),
        "--key",
        str(node_files / "my.key"),
        "--duration",
        "2",
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    shown = cli("status", env=env)
    assert shown.returncode == 0, shown.stderr
    assert str(node_files / "root" / "nodes") in shown.stdout


def test_audit_takes_data_dir_and_names_the_run_flag(tmp_path: Path):
    from trainer import tiny_policy

    built = tiny_policy.policy_dir()
    if not tiny_policy.is_built(built):
        pytest.skip("built-in policy not built (swarm-node init-model)")
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / built.name).symlink_to(built)  # as `init-model --data-dir data` leaves it
    records = tmp_path / "none.msgpack"
    records.write_bytes(b"")  # an empty stream: a failed record, not a usage error
    env = {"SWARM_NODE_DATA": str(tmp_path / "empty")}
    missing = cli("audit", str(records), env=env)
    assert missing.returncode == 2 and "init-model" in missing.stderr
    found = cli("audit", str(records), "--data-dir", str(data), env=env)
    assert found.returncode != 2 and "init-model" not in found.stderr, found.stderr  # model found
    assert "no --run" in found.stderr and "--manifest" not in found.stderr
