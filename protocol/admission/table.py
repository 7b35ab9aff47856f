"""The admission pipeline table (stages x kinds x who pays), generated from the code's own
tables: `PIPELINE`, `KIND_RULES` (which stages each kind goes through), `STAGE_REASONS`
(what each stage refuses for), and the costs (`PENALTIES`, `REPEATS_DOUBLE`,
`RELAY_BLAMED`, `protocol.penalties`).

`docs/DESIGN.md` holds its output between the `admission-table` markers, and a test keeps
the two equal. Regenerate with `python -m protocol.admission.table`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from protocol import penalties as offences
from protocol.admission.kinds import KIND_RULES, KindRule
from protocol.admission.vocabulary import (
    PENALTIES,
    PIPELINE,
    RELAY_BLAMED,
    REPEATS_DOUBLE,
    STAGE_REASONS,
    Kind,
    Reason,
    Stage,
)

__all__ = ["pipeline_table", "reason_cell"]

START_MARKER = "<!-- admission-table:start -->"
END_MARKER = "<!-- admission-table:end -->"

NOTE = (
    "Costs are the defaults of `protocol.penalties`; a stage waives one where the fault is "
    "not provable: a sender over RATE pays only past its overrun allowance, a signer over "
    "its QUOTA rate is dropped free, a STALE pull or a rollout that went stale on its way "
    "is free, and the author of another key's message pays for NEW_IDENTITIES "
    "(`protocol/admission/machine.py` describes each)."
)


def reason_cell(reason: Reason, penalties: Mapping[Reason, float] = PENALTIES) -> str:
    """One refusal reason with its default cost and who pays it, for example
    `wrong_run (-10, signer; x2 on repeat; relay pays)`."""
    cost = penalties[reason]
    if cost == 0:
        return f"{reason} (free)"
    parts = [f"{cost:g}", str(offences.BY_NAME[reason].payer)]
    if reason in REPEATS_DOUBLE:
        parts.append("x2 on repeat")
    parts.append("relay pays" if reason in RELAY_BLAMED else "relay free")
    return f"{reason} ({', '.join(parts)})"


def pipeline_table(
    stages: Sequence[Stage] = PIPELINE,
    rules: Mapping[Kind, KindRule] = KIND_RULES,
    reasons: Mapping[Stage, Sequence[Reason]] = STAGE_REASONS,
    penalties: Mapping[Reason, float] = PENALTIES,
) -> str:
    """The pipeline as a markdown table: one row per stage in `stages` order, one column
    per kind of `rules` (x: the kind goes through the stage; GATE applies to every message,
    before its kind is known), and the stage's refusals with their default cost and payer."""
    kinds = list(rules)
    through = {k: set(r.stages()) for k, r in rules.items()}
    head = ["stage", *(f"`{k}`" for k in kinds), "refuses for (default cost, who pays)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stage in stages:
        marks = ["x" if stage in through[k] else "" for k in kinds]
        refusals = "; ".join(reason_cell(r, penalties) for r in reasons.get(stage, ()))
        lines.append("| " + " | ".join([str(stage).upper(), *marks, refusals or "-"]) + " |")
    lines += ["", NOTE]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the table (to paste between the markers in docs/DESIGN.md)."""
    print(pipeline_table(), end="")


if __name__ == "__main__":
    main()
