"""Errors the CLI turns into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations


class CommandError(Exception):
    """A user-facing failure: bad path, bad key file, bad config, unusable model directory.

    `exit_code` follows the CLI convention: 2 for usage, IO and configuration errors,
    1 for a check that ran and failed (an audit that found fraud, say).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
