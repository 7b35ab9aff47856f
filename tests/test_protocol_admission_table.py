"""The admission pipeline table in docs/DESIGN.md is the one the code generates, and the
stage reasons it lists are the ones the code raises."""

from __future__ import annotations

import ast
from pathlib import Path

from protocol.admission import KIND_RULES, PIPELINE, STAGE_REASONS, Reason, Stage
from protocol.admission.table import END_MARKER, START_MARKER, pipeline_table

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGE = ROOT / "protocol" / "admission"


def committed_table() -> str:
    text = DESIGN.read_text()
    start = text.index(START_MARKER) + len(START_MARKER)
    return text[start : text.index(END_MARKER, start)].strip("\n") + "\n"


def test_design_doc_holds_the_generated_table():
    assert committed_table() == pipeline_table(), (
        "docs/DESIGN.md's admission table is out of date: regenerate it with "
        "`python -m protocol.admission.table` and paste the output between "
        f"{START_MARKER} and {END_MARKER}"
    )


def test_the_table_follows_the_stage_list():
    # The generator reads the stage list it is given: another order gives another table,
    # so the committed text could not match a pipeline the code does not run.
    reordered = (Stage.GATE, Stage.SIZE, Stage.DECODE, *PIPELINE[3:])
    assert reordered != PIPELINE
    assert pipeline_table(reordered) != pipeline_table()
    rows = [line.split(" | ")[0].lstrip("| ") for line in pipeline_table().splitlines()[2:]]
    assert rows[: len(PIPELINE)] == [str(s).upper() for s in PIPELINE]


def test_the_table_follows_the_kind_rules():
    fewer = {k: r for k, r in KIND_RULES.items() if k != "verdict"}
    assert pipeline_table(rules=fewer) != pipeline_table()


def raised_pairs() -> set[tuple[str, str]]:
    """(stage, reason) of every `Refused(Stage.X, Reason.Y, ...)` and CONTEXT's
    `refuse(Reason.Y, ...)` in the package's source."""
    pairs: set[tuple[str, str]] = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            args = [a.attr for a in node.args if isinstance(a, ast.Attribute)]
            if node.func.id == "Refused" and len(args) >= 2:
                pairs.add((args[0], args[1]))
            elif node.func.id == "refuse" and args:
                pairs.add(("CONTEXT", args[0]))
    return pairs


def test_stage_reasons_are_what_the_stages_raise():
    pairs = raised_pairs()
    assert pairs, "no Refused(...) found: the scan no longer reads the code"
    listed = {(s.name, r.name) for s, rs in STAGE_REASONS.items() for r in rs}
    # UNBACKED_VERSION is charged at CONTEXT when a sender fails to back a claim it made
    # there (`Trust.unbacked`), not raised by the stage itself.
    assert pairs == listed - {("CONTEXT", Reason.UNBACKED_VERSION.name)}
    assert set(STAGE_REASONS) == set(PIPELINE)
