"""Progress lines for people. Commands and benchmarks return their result (printed as JSON
on stdout) and report progress one flushed line at a time on stderr, so a pipe reading
the result never sees progress and a person watching sees each line at once.
`swarm-node start` writes its own lines to stdout (the node's log is stderr's)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


def say(msg: str, *, prefix: str = "", stdout: bool = False) -> None:
    """Print `msg` (led by `prefix: ` when given) to stderr, or stdout when told, flushed.
    The stream is looked up at each call (a test's captured stream is honoured)."""
    out = sys.stdout if stdout else sys.stderr
    print(f"{prefix}: {msg}" if prefix else msg, file=out, flush=True)


def sayer(prefix: str = "", *, stdout: bool = False) -> Callable[[str], None]:
    """`say` with its prefix and stream fixed (e.g. `sayer("bench gossip")`)."""
    return functools.partial(say, prefix=prefix, stdout=stdout)
