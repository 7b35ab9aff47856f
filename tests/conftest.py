"""Fixtures every test module may ask for by name (helpers to import: `tests/support`)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def tok() -> Any:
    """The built-in policy's tokenizer (`trainer.tiny_policy`, seed 0): deterministic."""
    from trainer.tiny_policy import build_tokenizer

    return build_tokenizer(seed=0)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The verify tests' micro policy, run manifest, key and honest records
    (`tests.support.audit_env`)."""
    from tests.support.audit_env import build_audit_env

    return build_audit_env(tmp_path_factory)
