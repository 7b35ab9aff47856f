"""Key files, configuration and run-manifest validation, and the CLI's one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from node.config import load_config
from node.errors import CommandError
from node.keyfile import read_key, write_key
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from protocol.identity import Identity
from tests.support.cli import run_cli as cli

# --- key files -----------------------------------------------------------------------


def test_keygen_then_id(tmp_path):
    key = tmp_path / "node.key"
    made = cli("keygen", "--out", str(key))
    assert made.returncode == 0, made.stderr
    assert (key.stat().st_mode & 0o777) == 0o600
    shown = cli("id", str(key))
    assert shown.returncode == 0
    assert shown.stdout.strip() == made.stdout.strip()
    assert shown.stdout.startswith("12D3KooW")


def test_keygen_refuses_to_overwrite(tmp_path):
    key = tmp_path / "node.key"
    write_key(key, Identity.generate())
    before = key.read_bytes()
    refused = cli("keygen", "--out", str(key))
    assert refused.returncode == 2
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert key.read_bytes() == before
    assert cli("keygen", "--out", str(key), "--force").returncode == 0
    assert key.read_bytes() != before


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing", "does not exist"),
        ("world", "readable by group or others"),
        ("group", "readable by group or others"),
        ("garbage", "not a PEM Ed25519 private key"),
        ("directory", "not a regular file"),
        ("rsa", "not an Ed25519 key"),
    ],
)
def test_bad_key_files_give_one_line_and_exit_2(tmp_path, setup, message):
    key = tmp_path / "k"
    if setup in ("world", "group"):
        write_key(key, Identity.generate())
        key.chmod(0o644 if setup == "world" else 0o640)
    elif setup == "garbage":
        key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnope\n")
        key.chmod(0o600)
    elif setup == "directory":
        key.mkdir()
    elif setup == "rsa":
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
        )

        pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
        key.write_bytes(pem)
        key.chmod(0o600)
    result = cli("id", str(key))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""


def test_key_round_trip_in_process(tmp_path):
    ident = Identity.generate()
    write_key(tmp_path / "k", ident)
    assert read_key(tmp_path / "k").peer_id == ident.peer_id


# --- configuration ---------------------------------------------------------------------


def test_config_defaults_file_and_flag_override(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('[node]\nrole = "validator"\n[network]\nio_timeout_s = 3\n')
    cfg = load_config(path, {"network.io_timeout_s": 4.5, "node.data_dir": None})
    assert cfg["node.role"] == "validator"
    assert cfg["network.io_timeout_s"] == 4.5
    assert cfg["network.dial_timeout_s"] == 10.0
    assert cfg["node.data_dir"] == ""  # the default: node.paths decides


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[node]\nrole = "miner"\n',
            "node.role: expected inference | trainer | validator | relay, got 'miner'",
        ),
        ("[network]\nio_timeout_s = -1\n", "network.io_timeout_s: expected a number in (0, 600]"),
        ('[network]\nio_timeout_s = "soon"\n', "got 'soon'"),
        ("[network]\nmax_peers = 1.5\n", "network.max_peers: expected an integer"),
        ("[nodes]\nrole = 1\n", "unknown section [nodes]"),
        ("[node]\nrol = 1\n", "unknown config key 'node.rol'; allowed: node.role"),
        ("[node\n", "not valid TOML"),
        ('[node]\nlisten = ["tcp/1"]\n', "node.listen: expected multiaddrs"),
        ("[network]\nheartbeat_interval_s = 5\nheartbeat_timeout_s = 2\n", "heartbeat_timeout_s"),
    ],
)
def test_config_errors_name_key_and_allowed(tmp_path, text, message):
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(CommandError) as info:
        load_config(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_config_flag_errors_and_unreadable_file(tmp_path):
    with pytest.raises(CommandError, match="validator.audit_fraction"):
        load_config(None, {"validator.audit_fraction": 2})
    with pytest.raises(CommandError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CommandError, match="not valid TOML"):
        load_config(tmp_path / "bin.toml")


# --- run manifest ----------------------------------------------------------------------


def test_run_manifest_toml_round_trip(tmp_path):
    table = {
        "run": {"id": "demo", "seed": 5, "trainer_keys": [Identity.generate().peer_id_b58]},
        "sampling": {"temperature": 1, "top_k": 20},
        "datasets": [{"name": "basic_arithmetic", "weight": 3}, {"name": "chain_sum"}],
    }
    m = manifest_from_table(table)
    path = tmp_path / "run.toml"
    path.write_text(manifest_to_toml(m))
    assert load_run_manifest(path) == m
    assert tomllib.loads(path.read_text())["run"]["id"] == "demo"


@pytest.mark.parametrize(
    "table, message",
    [
        ({"datasets": [{"name": "a"}]}, "missing required key run.id"),
        ({"run": {"id": "d"}}, "at least one [[datasets]]"),
        (
            {"run": {"id": "d"}, "sampling": {"top_p": 2.0}, "datasets": [{"name": "a"}]},
            "sampling.top_p: 2.0 out of range",
        ),
        (
            {"run": {"id": "d", "trainer_keys": ["nope"]}, "datasets": [{"name": "a"}]},
            "run.trainer_keys",
        ),
        (
            {"run": {"id": "d"}, "datasets": [{"name": "a", "weight": 0}]},
            "datasets[0]: 0 out of range",
        ),
        ({"run": {"id": "d"}, "extra": {}, "datasets": [{"name": "a"}]}, "unknown section [extra]"),
        (
            {"run": {"id": "d", "model_digest": "zz"}, "datasets": [{"name": "a"}]},
            "run.model_digest",
        ),
    ],
)
def test_run_manifest_errors(table, message):
    with pytest.raises(CommandError) as info:
        manifest_from_table(table)
    assert message in str(info.value)


# --- CLI surface -----------------------------------------------------------------------


def test_help_lists_the_network_commands():
    result = cli("--help")
    assert result.returncode == 0
    for command in ("start", "devnet", "sim", "audit", "bench", "keygen", "id", "status"):
        assert command in result.stdout


def test_unknown_benchmark_is_a_clear_error():
    result = cli("bench", "nosuch")
    assert result.returncode == 2
    assert "unknown benchmark 'nosuch'" in result.stderr and "codec" in result.stderr


def test_bench_help_lists_every_benchmark():
    result = cli("bench", "--help")
    assert result.returncode == 0
    listed = " ".join(result.stdout.split("NAME:", 1)[1].split("\n\n", 1)[0].split())
    benches = sorted(
        p.stem for p in (Path(__file__).parent.parent / "swarm_node_bench").glob("[a-z]*.py")
    )
    assert [b.strip() for b in listed.split(",")] == benches


@pytest.mark.slow
def test_bench_codec_quick_json_is_last_line():
    result = cli("bench", "codec", "--json", "--quick")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout.strip().splitlines()[-1])
    for key in (
        "encode_per_s",
        "decode_per_s",
        "sign_per_s",
        "verify_per_s",
        "record_bytes",
        "fuzz_cases",
        "fuzz_failures",
    ):
        assert key in data
    assert data["fuzz_failures"] == 0 and data["fuzz_cases"] >= 4000
    assert 7000 < data["record_bytes"] < 10_000


def test_cli_runs_without_a_home_cache(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0


def test_sim_with_an_unknown_scenario_is_one_line_and_exits_2(tmp_path):
    result = cli("sim", "no-such-scenario", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "no scenario 'no-such-scenario'" in result.stderr
    assert not (tmp_path / "out").exists()
