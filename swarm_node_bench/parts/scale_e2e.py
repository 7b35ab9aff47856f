"""`bench scale`'s `e2e` part: trainer + 2 workers + validator on loopback, on the bench's model.

Runs `swarm-node devnet --model DIR --inference 2 --validators 1 --duration S --no-live
--out OUT` (real node processes; the parent's memory cap covers the whole process tree) and
reads its `report.json`:

- `version_latency_s`: per published version, the time until the last worker swapped to
  it (the report's `versions[].spread_s`), median over the versions all workers reached;
- `audited_per_hour`: records audited by the validator (`totals.audited`) per hour of run;
- `stale_fraction`: rollouts refused as too stale (`totals.too_stale`) ÷ produced.

Where the installed `devnet` has no `--model` option the part says so and measures nothing.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def devnet_takes_model() -> bool:
    """Whether this installation's `swarm-node devnet` has a `--model` option."""
    from node.commands.devnet import command  # deferred: heavy import

    return any("--model" in getattr(p, "opts", ()) for p in command.params)


def e2e_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part (module docstring); `config`: model_dir, duration_s, work."""
    if not devnet_takes_model():
        return {"status": "skipped: `swarm-node devnet` has no --model option here"}
    out = Path(config["work"]) / "devnet"
    duration = int(config.get("duration_s", 600))
    cmd = [
        sys.executable,
        "-m",
        "node.cli",
        "devnet",
        "--model",
        config["model_dir"],
        "--inference",
        "2",
        "--validators",
        "1",
        "--duration",
        str(duration),
        "--no-live",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    report_file = out / "report.json"
    if not report_file.is_file():
        return {"status": f"failed: devnet exit status {proc.returncode}, no report.json"}
    return figures(json.loads(report_file.read_text()), duration)


def figures(report: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The part's figures from a devnet `report.json` (module docstring)."""
    totals = report.get("totals") or {}
    spreads = [v["spread_s"] for v in report.get("versions") or [] if v.get("spread_s") is not None]
    produced = totals.get("produced") or 0
    return {
        "version_latency_s": round(statistics.median(spreads), 2) if spreads else None,
        "versions_reached_by_all": len(spreads),
        "audited_per_hour": round(totals.get("audited", 0) * 3600 / duration_s, 1),
        "stale_fraction": round(totals.get("too_stale", 0) / produced, 4) if produced else None,
        "produced": produced,
        "duration_s": duration_s,
    }
