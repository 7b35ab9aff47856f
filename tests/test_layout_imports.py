"""The import arrows of docs/DESIGN.md hold: protocol imports nothing of ours, verify only
protocol, trainer only protocol and verify, swarm_sim never node, swarm_node_bench anything
but nothing imports it (except the `bench` command, node/commands/bench.py, by name at run time),
only swarm_node_bench and tests import the harness `node.testing`, only node/host and
node/testing import py-libp2p, and roles never reach into command modules. Checked on the
source, so a violation fails here before it becomes a tangle."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"protocol", "verify", "trainer", "node", "swarm_sim", "swarm_node_bench", "tests"}
ALLOWED = {
    "protocol": {"protocol"},
    "verify": {"protocol", "verify"},
    "trainer": {"protocol", "verify", "trainer"},
    "swarm_sim": {"protocol", "verify", "trainer", "swarm_sim"},
    "node": {"protocol", "verify", "trainer", "node", "swarm_sim"},
    "swarm_node_bench": {"protocol", "verify", "trainer", "node", "swarm_sim", "swarm_node_bench"},
}
# The `bench` subcommand imports the benchmark it runs, by name (`BENCH_PACKAGE`): the one
# exception to "nothing imports swarm_node_bench", and it stays in this file.
BENCH_IMPORTER = "node/commands/bench.py"
BENCH = "swarm_node_bench"
# The harness tests and benchmarks share: imported by these, and by itself.
TESTING = "node.testing"
TESTING_IMPORTERS = ("swarm_node_bench/", "tests/", "node/testing/")
# py-libp2p stays behind the host adapter; the testing harness drives plain py-libp2p hosts
# too (the connection attacks). (`multiaddr`, its own distribution, is not counted.)
LIBP2P = {"libp2p"}
LIBP2P_IMPORTERS = ("node/host/", "node/testing/")


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import in `path` (at any depth, lazy ones too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)} & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    files = sorted((ROOT / package).rglob("*.py"))
    if package != "swarm_sim":
        assert files, f"{package}/ has no modules"
    allowed = ALLOWED[package]
    bad = {
        str(f.relative_to(ROOT)): sorted(
            imported_packages(f) - allowed - ({BENCH} if rel(f) == BENCH_IMPORTER else set())
        )
        for f in files
    }
    bad = {f: pkgs for f, pkgs in bad.items() if pkgs}
    assert not bad, f"imports against the layout: {bad}"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_bench_command_imports_bench_only_by_name():
    # node/commands/bench.py resolves the benchmark by name at run time (importlib, `BENCH_PACKAGE`),
    # also to list the benchmarks it has: no import statement names the package.
    names = {n for n in imported_modules(ROOT / BENCH_IMPORTER) if n.split(".")[0] == BENCH}
    assert not names, names
    assert f'BENCH_PACKAGE = "{BENCH}"' in (ROOT / BENCH_IMPORTER).read_text()


def product_files() -> list[Path]:
    """Every module of ours outside tests/ (the packages of OURS, at any depth)."""
    return sorted(f for package in sorted(OURS - {"tests"}) for f in (ROOT / package).rglob("*.py"))


def importers_of(files: list[Path], wanted: Callable[[str], bool]) -> dict[str, list[str]]:
    """File -> the modules it imports that `wanted` picks (files importing none left out)."""
    found = {rel(f): sorted(n for n in imported_modules(f) if wanted(n)) for f in files}
    return {f: names for f, names in found.items() if names}


def is_testing(name: str) -> bool:
    return name == TESTING or name.startswith(TESTING + ".")


def is_libp2p(name: str) -> bool:
    return name.split(".")[0] in LIBP2P


def harness_violations(files: list[Path]) -> dict[str, list[str]]:
    """Imports of `node.testing` from anywhere but the benchmarks, the tests and itself."""
    found = importers_of(files, is_testing)
    return {f: n for f, n in found.items() if not f.startswith(TESTING_IMPORTERS)}


def libp2p_violations(files: list[Path]) -> dict[str, list[str]]:
    """Imports of py-libp2p from anywhere but node/host and node/testing."""
    found = importers_of(files, is_libp2p)
    return {f: n for f, n in found.items() if not f.startswith(LIBP2P_IMPORTERS)}


def test_only_benchmarks_and_tests_import_the_testing_harness():
    files = product_files() + sorted((ROOT / "tests").rglob("*.py"))
    bad = harness_violations(files)
    assert not bad, f"node.testing imported outside swarm_node_bench and tests: {bad}"


def test_only_the_host_adapter_and_the_harness_import_libp2p():
    bad = libp2p_violations(product_files())
    assert not bad, f"py-libp2p imported outside node/host and node/testing: {bad}"


@pytest.mark.parametrize(
    ("where", "source", "check"),
    [
        (
            "node/peer/probe_m.py",
            "from node.testing.records import net_manifest\n",
            harness_violations,
        ),
        ("protocol/probe_m.py", "import node.testing\n", harness_violations),
        (
            "node/peer/probe_m.py",
            "def f():\n    from libp2p.peer.id import ID\n",
            libp2p_violations,
        ),
        ("swarm_node_bench/probe_m.py", "import libp2p\n", libp2p_violations),
    ],
)
def test_new_checks_see_a_violation(where, source, check):
    # A probe module written where it must not import what it does: the check names it.
    probe = ROOT / where
    assert not probe.exists()
    probe.write_text(source)
    try:
        assert check(product_files()) == {where: sorted(imported_modules(probe))}
    finally:
        probe.unlink()


def test_roles_do_not_import_commands():
    # Logic a role shares with a command lives in the layer it belongs to, never in
    # node/commands (whose modules are the CLI's).
    bad = {
        rel(f): sorted(n for n in imported_modules(f) if n.startswith("node.commands"))
        for f in sorted((ROOT / "node" / "roles").rglob("*.py"))
    }
    bad = {f: names for f, names in bad.items() if names}
    assert not bad, f"roles importing command modules: {bad}"


def test_checker_sees_a_violation(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom node.store.store import Store\nfrom . import sibling\n")
    assert imported_packages(module) == {"node"}


def test_no_top_level_examples_package():
    # py-libp2p's wheel installs a top-level `examples` package: never shadow it.
    assert not (ROOT / "examples" / "__init__.py").exists()
