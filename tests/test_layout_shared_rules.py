"""The simulator re-implements no rule: every rule module of `protocol/` that the node
uses is one the simulator runs too (imported directly or through another rule module),
or is listed below with the reason the simulator does not model it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Wire formats, keys and errors: data, not rules.
DATA = {
    "protocol.codec",
    "protocol.content_id",
    "protocol.envelope",
    "protocol.errors",
    "protocol.fuzz",
    "protocol.identity",
    "protocol.rollout",
    "protocol.schema",
    "protocol.wire",
}
# Rules the simulator does not model, and why.
NOT_SIMULATED = {
    "protocol.catch_up": "simulated peers keep no store, so a rejoining peer has nothing to catch up from",
    "protocol.audit_queue": "the simulator runs no model: no audits, no audit queue",
    "protocol.fraud": "the simulator runs no model: no audits, so no fraud evidence",
    "protocol.run_manifest": "simulated peers share one run from the start: no releases to find, check or adopt",
    "protocol.producer_cases": "the simulator runs no model: no per-producer audit windows",
    "protocol.standing": "the simulator runs no model: no audits, so no standing earned or lost by them",
    "protocol.verified": "the simulator has no trainer loop that waits for verdicts",
    "protocol.judges": "the simulator has no trainer loop that waits for verdicts: no validators to compare",
    "protocol.credit": "the simulator runs no model: no bodies are re-scored and no verdicts judged, so nothing is credited",
    "protocol.weights_plan": "versions are adopted as one download (swarm_sim.broadcast runs the shard rules)",
    "protocol.forwarding": "simulated headers travel one per message: no HeaderBatch, and a Forward action is what is forwarded",
    "protocol.hole_punch": "simulated peers reach each other directly: no NAT, no relay, no hole punching",
    "protocol.reachability": "simulated peers are all reachable: no NAT, so no AutoNAT rounds",
    "protocol.model_bundle": "simulated peers start with the run's model: no model files to fetch",
}


def _protocol_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "protocol":
                out |= {f"protocol.{a.name}" for a in node.names}
            elif node.module.startswith("protocol."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("protocol.")}
    return out


def _imports_of(folder: str) -> set[str]:
    out: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        out |= _protocol_imports(path)
    return out


def _closure(modules: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        module = ROOT / m.replace(".", "/")
        for path in (module.with_suffix(".py"), module / "__init__.py"):
            if path.exists():
                todo.extend(_protocol_imports(path))
    return seen


def test_every_rule_the_node_uses_runs_in_the_simulator_or_is_listed() -> None:
    node_rules = _imports_of("node") - DATA
    simulated = _closure(_imports_of("swarm_sim"))
    missing = node_rules - simulated - set(NOT_SIMULATED)
    assert not missing, (
        f"rule modules the node uses and the simulator neither runs nor lists: {sorted(missing)}"
    )
    # The list stays honest: nothing in it that the simulator does run, or that the node does not use.
    assert not set(NOT_SIMULATED) & simulated, sorted(set(NOT_SIMULATED) & simulated)
    assert set(NOT_SIMULATED) <= node_rules, sorted(set(NOT_SIMULATED) - node_rules)


def test_the_body_pull_and_admission_rules_are_shared() -> None:
    simulated = _closure(_imports_of("swarm_sim"))
    assert {
        "protocol.admission",
        "protocol.body_pull",
        "protocol.shard_schedule",
        "protocol.accounting",
        "protocol.peer_score",
    } <= simulated
