"""The relay service's limits come from the config file's `[relay]` keys or `--relay-limit`
flags: defaults are what `node.host.relay.RelayLimitsConfig` grants, a bad value is a clear
one-line error (exit 2), and the values reach the limits the relay enforces."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import load_config, parse_relay_limits
from node.errors import CommandError
from node.host.relay import RelayLimitsConfig
from node.settings import relay_limits
from tests.support.cli import run_cli


def test_the_config_defaults_are_the_relay_defaults() -> None:
    assert relay_limits(load_config()) == RelayLimitsConfig()


def test_file_and_flags_set_the_relay_limits(tmp_path: Path) -> None:
    conf = tmp_path / "node.toml"
    conf.write_text(
        "[relay]\nmax_reservations = 16\nmax_reservations_per_ip = 2\nmax_circuit_s = 60\n"
    )
    limits = relay_limits(
        load_config(conf, parse_relay_limits(["max_circuits_per_peer=3", "max_circuit_s=90"]))
    )
    assert limits == RelayLimitsConfig(
        max_reservations=16, max_reservations_per_ip=2, max_circuits_per_peer=3, max_circuit_s=90
    )
    library = limits.library_limits()
    assert (library.max_reservations, library.max_circuit_conns, library.duration) == (16, 3, 90)


@pytest.mark.parametrize(
    "body, expect",
    [
        (
            "max_reservations = 0",
            "relay.max_reservations: expected an integer in [1, 100000], got 0",
        ),
        (
            "max_circuit_bytes = 'lots'",
            "relay.max_circuit_bytes: expected an integer of bytes in [1024, 2^40], got 'lots'",
        ),
        ("max_circuit_s = 1.5", "relay.max_circuit_s: expected an integer in [1, 604800], got 1.5"),
        (
            "max_reservations = 4\nmax_reservations_per_ip = 5",
            "relay.max_reservations_per_ip: expected at most relay.max_reservations (4), got 5",
        ),
        (
            "max_slots = 4",
            "unknown config key 'relay.max_slots'; allowed: relay.max_reservations, ",
        ),
    ],
)
def test_a_bad_relay_limit_in_the_file_is_a_clear_error(
    tmp_path: Path, body: str, expect: str
) -> None:
    conf = tmp_path / "node.toml"
    conf.write_text(f"[relay]\n{body}\n")
    with pytest.raises(CommandError) as err:
        load_config(conf)
    assert expect in str(err.value)


def test_a_bad_relay_limit_on_the_command_line_exits_2_with_one_line(tmp_path: Path) -> None:
    for flag, expect in (
        (
            "max_reservations=-1",
            "relay.max_reservations: expected an integer in [1, 100000], got -1",
        ),
        ("max_reservations", "--relay-limit: expected NAME=INTEGER"),
        ("max_circuit_bytes=1e9", "--relay-limit: expected NAME=INTEGER"),
    ):
        r = run_cli(
            "start",
            "--role",
            "relay",
            "--key",
            str(tmp_path / "none.key"),
            "--run",
            str(tmp_path / "r.toml"),
            "--relay-limit",
            flag,
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
