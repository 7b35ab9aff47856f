"""Where things are: one resolution of data directory, key, run file and model for every
command (`start`, `rollouts`, `audit`, `status`, `init-model`).

- The data root holds the model cache (`<root>/models/`) and, by default, each node's own
  directory (`<root>/nodes/<peer id tail>-<role>/`). It is `--data-dir`, else
  `$SWARM_NODE_DATA`, else `~/.cache/swarm-node`.
- `start --data-dir D` (or `node.data_dir` in the config file) is that node's own
  directory; a model is looked for under `D/models/` first, then under the default root,
  so `init-model --data-dir D` followed by any command with `--data-dir D` finds it.
- Key and run file come from the flag, else from the config file (paths there are
  relative to the config file); a missing one names both.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from node.errors import CommandError
from trainer import tiny_policy

# The store's file in a node's data directory.
DB_FILENAME = "node.sqlite3"


def data_root(value: str | Path | None = None) -> Path:
    """`value` if given, else $SWARM_NODE_DATA, else ~/.cache/swarm-node."""
    return tiny_policy.default_data_dir(value)


def model_roots(data_dir: str | Path | None) -> list[Path]:
    """Where a built-in model may be cached, in search order (no duplicates)."""
    roots = [data_root(data_dir)] if data_dir else []
    default = data_root()
    if default not in roots:
        roots.append(default)
    return roots


def resolve_model(model: str | None, manifest_model: str, data_dir: str | Path | None) -> Path:
    """`--model` (a directory or `builtin:tiny`), else the manifest's model, as a directory.
    Built-in models are looked for under each of `model_roots(data_dir)`."""
    name = model or manifest_model
    if not name.startswith("builtin:"):
        path = Path(name).expanduser()
        if not path.is_dir():
            problem = "is not a directory" if path.exists() else "does not exist"
            raise CommandError(f"model directory {path} {problem}")
        return path
    if name != tiny_policy.BUILTIN_MODEL:
        raise CommandError(f"unknown built-in model {name!r} (known: {tiny_policy.BUILTIN_MODEL})")
    roots = model_roots(data_dir)
    for root in roots:
        path = tiny_policy.policy_dir(root)
        if tiny_policy.is_built(path):
            return path
    where = " or ".join(str(r) for r in roots)
    hint = f" --data-dir {roots[0]}" if data_dir else ""
    raise CommandError(
        f"the built-in policy is not built yet in {where}; run: swarm-node init-model{hint}"
    )


def required_path(flag_value: str | Path | None, cfg_value: str, flag: str, key: str) -> Path:
    """The flag's path, else the config file's; neither: a one-line error naming both."""
    value = flag_value or cfg_value
    if not value:
        raise CommandError(f"{flag} is required (or {key} in the --config file)")
    return Path(value).expanduser()


def check_writable(path: str | Path, flag: str) -> None:
    """A one-line error now, before any work, when `path` (a file or directory to be
    written, existing or not) could not be written: its nearest existing ancestor is not a
    directory, or lies on a read-only file system, or this process may not write there."""
    path = Path(path).expanduser()
    where = path if path.is_dir() else path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise CommandError(f"{flag} {path}: {where} is not a directory")
    problem = None
    try:
        if os.statvfs(where).f_flag & os.ST_RDONLY:
            problem = os.strerror(errno.EROFS)
    except OSError as exc:
        problem = exc.strerror
    if problem is None and not os.access(where, os.W_OK | os.X_OK):
        problem = os.strerror(errno.EACCES)
    if problem is None and path.is_file() and not os.access(path, os.W_OK):
        where, problem = path, os.strerror(errno.EACCES)
    if problem is not None:
        raise CommandError(f"{flag} {path}: cannot write in {where} ({problem.lower()})")


def node_dir(data_dir: str | Path | None, peer_id_b58: str, role: str) -> Path:
    """A node's own directory: the one given, else `<data root>/nodes/<id tail>-<role>`."""
    if data_dir:
        return Path(data_dir).expanduser()
    return data_root() / "nodes" / f"{peer_id_b58[-12:]}-{role}"


def find_node_dirs(root: Path) -> list[Path]:
    """Node directories holding a store: `root` itself, or those under `root/nodes/`."""
    if (root / DB_FILENAME).is_file():
        return [root]
    nodes = root / "nodes"
    if not nodes.is_dir():
        return []
    return sorted(p for p in nodes.iterdir() if (p / DB_FILENAME).is_file())


def node_dirs(given: Path) -> list[Path]:
    """The node data directories a folder names: a data directory itself, a devnet node
    folder (`<name>/data`), or a devnet report folder (`nodes/<name>/data` each). A folder
    holding none is returned as is (the caller says no store is there)."""
    given = Path(given).expanduser()
    if (given / DB_FILENAME).is_file():
        return [given]
    if (given / "data" / DB_FILENAME).is_file():
        return [given / "data"]
    nodes = given / "nodes"
    found = (
        sorted(p / "data" for p in nodes.iterdir() if (p / "data" / DB_FILENAME).is_file())
        if nodes.is_dir()
        else []
    )
    return found or [given]


def find_node_dir(data_dir: str | Path | None) -> Path:
    """The node directory a command reads (`status`, `ledger`): the one the given folder
    names (a data directory, a devnet node or report folder holding one node), else the
    only one under the data root."""
    if data_dir:
        found = node_dirs(Path(data_dir))
        if len(found) > 1:
            raise CommandError(
                f"{len(found)} nodes under {data_dir}; give one with --data-dir: "
                + ", ".join(str(p.parent) for p in found)
            )
        return found[0]
    root = data_root()
    found = find_node_dirs(root)
    if len(found) == 1:
        return found[0]
    if not found:
        raise CommandError(f"no node store under {root} (give the node's --data-dir)")
    raise CommandError(
        f"{len(found)} nodes under {root / 'nodes'}; give one with --data-dir: "
        + ", ".join(p.name for p in found)
    )
