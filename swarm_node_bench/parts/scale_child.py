"""One part of `bench scale` in its own process: `python -m swarm_node_bench.parts.scale_child
MODULE:FUNCTION CONFIG.json RESULT.json`.

Imports MODULE, calls FUNCTION(config) and writes the dict it returns to RESULT.json.
`MemoryError` becomes `{"status": "oom"}`; any other exception `{"status": "failed: ..."}`
(one line) and exit status 1. Progress goes to stderr (`swarm_node_bench.parts.scale_runner`
sends this process's stdout there too).
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    """Run the part named in `argv` (see the module docstring); returns the exit status."""
    target, cfg_path, out_path = argv
    module_name, func_name = target.split(":")
    config = json.loads(Path(cfg_path).read_text())
    status = 0
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        result = func(config)
    except MemoryError:
        result, status = {"status": "oom"}, 1
    except Exception as exc:  # a part's failure is a figure of the bench, not a crash of it
        traceback.print_exc(file=sys.stderr)
        line = (str(exc).strip().splitlines() or [""])[0]
        result, status = {"status": f"failed: {type(exc).__name__}: {line}"[:300]}, 1
    Path(out_path).write_text(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
