"""The import graph of the product code has no cycles, no module reaches into another
module's private names, and a function-local import exists only to defer a heavy import
(marked `# deferred`). Every import counts: top-level, function-local and those under
`if TYPE_CHECKING:`. Checked on the source, so a tangle fails here before it grows."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("protocol", "verify", "trainer", "node", "swarm_sim", "swarm_node_bench")


@dataclass
class ModuleSource:
    """One module: its dotted name, file, and parsed tree."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module = field(repr=False)
    lines: list[str] = field(repr=False)


def load_modules(root: Path, packages: Iterable[str]) -> dict[str, ModuleSource]:
    """Every module under the given top-level packages of `root`, by dotted name."""
    modules: dict[str, ModuleSource] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            text = path.read_text()
            modules[".".join(parts)] = ModuleSource(
                ".".join(parts), path, is_package, ast.parse(text, str(path)), text.splitlines()
            )
    return modules


def resolve_from(module: ModuleSource, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement names (relative ones resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(module: ModuleSource, known: set[str]) -> set[str]:
    """The modules of ours that `module` imports anywhere in its source."""
    edges: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.add(nearest_known(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            source = resolve_from(module, node)
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                edges.add(candidate if candidate in known else nearest_known(source, known))
    edges.discard("")
    edges.discard(module.name)
    return edges


def nearest_known(name: str, known: set[str]) -> str:
    """The longest prefix of `name` that is one of our modules, or "" if none is."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return ""


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph`, those with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # Iterative depth-first search: (node, iterator over its successors).
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def import_cycles(root: Path, packages: Iterable[str]) -> list[list[str]]:
    """Every cycle (as a strongly connected component) in the import graph under `root`."""
    modules = load_modules(root, packages)
    known = set(modules)
    graph = {name: import_edges(module, known) for name, module in modules.items()}
    return strongly_connected(graph)


def private_reaches(root: Path, packages: Iterable[str]) -> list[str]:
    """`from x import _name` and `x._name` where x is another module of ours."""
    modules = load_modules(root, packages)
    known = set(modules)
    found: list[str] = []
    for module in modules.values():
        aliases: dict[str, str] = {}
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                source = resolve_from(module, node)
                if nearest_known(source, known) == "":
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in known:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif is_private(alias.name) and source != module.name:
                        found.append(f"{module.name}: from {source} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in known:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Attribute)
                and is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and aliases[node.value.id] != module.name
            ):
                found.append(f"{module.name}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


def is_private(name: str) -> bool:
    """A single-underscore name (dunders are the language's, not a module's privates)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def unmarked_local_imports(root: Path, packages: Iterable[str]) -> list[str]:
    """Imports inside a function body without a `# deferred` comment on their line."""
    found: list[str] = []
    for module in load_modules(root, packages).values():
        for func in ast.walk(module.tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                end = node.end_lineno or node.lineno
                text = " ".join(module.lines[node.lineno - 1 : end])
                if "# deferred" not in text:
                    found.append(f"{module.path.relative_to(root)}:{node.lineno}")
    return sorted(set(found))


def present(root: Path) -> list[str]:
    return [p for p in PRODUCT if (root / p).is_dir()]


def test_no_import_cycles():
    cycles = import_cycles(ROOT, present(ROOT))
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_names_across_modules():
    reaches = private_reaches(ROOT, present(ROOT))
    assert not reaches, "private names used from another module:\n" + "\n".join(reaches)


def test_function_local_imports_are_marked_deferred():
    unmarked = unmarked_local_imports(ROOT, present(ROOT))
    assert not unmarked, (
        "imports inside functions without `# deferred: <why>` (move them to the top of the "
        "module unless they defer a heavy import):\n" + "\n".join(unmarked)
    )


def write_package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checkers_see_violations(tmp_path):
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    from pkg.c import helper\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import thing\n"
                "from pkg.d import _hidden\n"
                "def helper():\n    import torch  # deferred: heavy import\n"
            ),
            "pkg/d.py": "import pkg.e as e\n_hidden = e._inner\n",
            "pkg/e.py": "_inner = 1\n",
        },
    )
    assert import_cycles(tmp_path, ["pkg"]) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert private_reaches(tmp_path, ["pkg"]) == [
        "pkg.c: from pkg.d import _hidden",
        "pkg.d: pkg.e._inner",
    ]
    assert unmarked_local_imports(tmp_path, ["pkg"]) == ["pkg/b.py:2"]
