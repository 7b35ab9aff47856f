"""Checks that a rollout came from the claimed policy: activation proofs, sampling replay, audits.

The code is organized as follows:

- `auditor.py`: the audit of records against a model (`audit`, `audit_many`, `audit_records`,
  `audit_versions`, `audit_bodies`) and its settings and results.
- `checks.py`: the individual checks, each a `CheckResult` with a reason code.
- `toploc.py`: the activation-hash proofs (TOPLOC-compatible bytes), built and checked.
- `sampling.py`: the seeded sampling rule, replayed by the verifier.
- `prefill.py`: the verifier's batched prefill over shared prefixes.
- `thresholds.py`: the audit limits and their calibration rule.
- `calibration.py`: calibration files: a model's measured limits, with a content id.
- `producer.py`: per-producer evidence over windows of audited records.

The auditor's names are loaded on first use (`verify.audit`), so `import verify` does not
import torch.
"""

from __future__ import annotations

from typing import Any

_FROM_AUDITOR = frozenset(
    {
        "audit",
        "audit_many",
        "audit_records",
        "audit_versions",
        "audit_bodies",
        "AuditResult",
        "AuditSettings",
        "TaskJudgement",
    }
)


def __getattr__(name: str) -> Any:
    """The auditor's public names, imported when first asked for."""
    if name in _FROM_AUDITOR:
        from verify import auditor  # deferred: heavy import

        return getattr(auditor, name)
    raise AttributeError(f"module 'verify' has no attribute {name!r}")
