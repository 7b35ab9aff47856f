"""Checks that a rollout came from the claimed policy: activation proofs, sampling replay, audits.

`verify.audit(rollout, model)` and `verify.audit_many(...)` are the entry points (loaded on
first use, so `import verify` stays cheap); `verify.toploc` holds the proof encoding,
`verify.checks` the individual checks and `verify.thresholds` their limits.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "audit",
    "audit_many",
    "audit_records",
    "audit_versions",
    "audit_bodies",
    "AuditResult",
    "AuditSettings",
    "TaskJudgement",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from verify import auditor

        return getattr(auditor, name)
    raise AttributeError(f"module 'verify' has no attribute {name!r}")
