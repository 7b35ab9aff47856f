"""The import arrows of DESIGN.md hold: protocol imports nothing of ours, verify only
protocol, trainer only protocol and verify, swarm_sim never node. Checked on the source,
so a violation fails here before it becomes a tangle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"protocol", "verify", "trainer", "node", "swarm_sim", "tests"}
ALLOWED = {
    "protocol": {"protocol"},
    "verify": {"protocol", "verify"},
    "trainer": {"protocol", "verify", "trainer"},
    "swarm_sim": {"protocol", "verify", "trainer", "swarm_sim"},
    "node": {"protocol", "verify", "trainer", "node", "swarm_sim"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    files = sorted((ROOT / package).rglob("*.py"))
    if package != "swarm_sim":
        assert files, f"{package}/ has no modules"
    bad = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) - ALLOWED[package]) for f in files
    }
    bad = {f: pkgs for f, pkgs in bad.items() if pkgs}
    assert not bad, f"imports against the layout: {bad}"


def test_checker_sees_a_violation(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom node.store import Store\nfrom . import sibling\n")
    assert imported_packages(module) == {"node"}


def test_no_top_level_examples_package():
    # py-libp2p's wheel installs a top-level `examples` package (DESIGN.md): never shadow it.
    assert not (ROOT / "examples" / "__init__.py").exists()
