"""The import arrows of docs/DESIGN.md hold: protocol imports nothing of ours, verify only
protocol, trainer only protocol and verify, swarm_sim never node, bench anything but
nothing imports bench (except the `bench` command, node/commands/bench.py, by name), and roles
never reach into command modules. Checked on the source, so a violation fails here
before it becomes a tangle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"protocol", "verify", "trainer", "node", "swarm_sim", "bench", "tests"}
ALLOWED = {
    "protocol": {"protocol"},
    "verify": {"protocol", "verify"},
    "trainer": {"protocol", "verify", "trainer"},
    "swarm_sim": {"protocol", "verify", "trainer", "swarm_sim"},
    "node": {"protocol", "verify", "trainer", "node", "swarm_sim"},
    "bench": {"protocol", "verify", "trainer", "node", "swarm_sim", "bench"},
}
# The `bench` subcommand imports the benchmark it runs: the one exception to "nothing
# imports bench", and it stays in this file.
BENCH_IMPORTER = "node/commands/bench.py"


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
            imported_packages(f) - allowed - ({"bench"} if rel(f) == BENCH_IMPORTER else set())
        )
        for f in files
    }
    bad = {f: pkgs for f, pkgs in bad.items() if pkgs}
    assert not bad, f"imports against the layout: {bad}"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_bench_command_imports_bench_only_by_name():
    # node/commands/bench.py resolves the benchmark by name at run time (importlib), and imports the
    # package itself only to list the benchmarks it has: never a benchmark module.
    names = {n for n in imported_modules(ROOT / BENCH_IMPORTER) if n.split(".")[0] == "bench"}
    assert names <= {"bench"}, names


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
