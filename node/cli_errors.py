"""How every `swarm-node` command reports failure: a `CommandError` becomes one line on
stderr (`swarm-node: error: ...`) and its exit code; Ctrl-C exits 130."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from node.errors import CommandError


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn `CommandError` (and unreadable files) into `swarm-node: error: ...` + exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CommandError as exc:
            click.echo(f"swarm-node: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except BaseExceptionGroup as group:
            # A CommandError raised inside a trio nursery arrives wrapped in a group.
            found = first_command_error(group)
            if found is None:
                raise
            click.echo(f"swarm-node: error: {found}", err=True)
            sys.exit(found.exit_code)
        except KeyboardInterrupt:
            click.echo("swarm-node: interrupted", err=True)
            sys.exit(130)

    return wrapper


def first_command_error(group: BaseExceptionGroup) -> CommandError | None:
    """The first `CommandError` anywhere inside an exception group (nested groups too)."""
    for exc in group.exceptions:
        if isinstance(exc, CommandError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (inner := first_command_error(exc)):
            return inner
    return None
