"""The `swarm-node` command group: which command lives where, loaded when it is needed.

Each command's click definition sits beside its implementation in `node.commands.<module>`
(`COMMANDS` maps a command name to its module and attribute). The group imports a command's
module only when that command is looked up (run, or listed by `--help`); the modules defer
their heavy imports (torch, transformers, libp2p) to the functions that need them, so
`swarm-node --help`, `swarm-node <cmd> --help` and usage errors load none of them. A usage
error, as every other error, is one line on stderr.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Any

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "audit": ("node.commands.audit", "command"),
    "bench": ("node.commands.bench", "command"),
    "calibrate": ("node.commands.calibrate", "command"),
    "devnet": ("node.commands.devnet", "command"),
    "doctor": ("node.commands.doctor", "command"),
    "id": ("node.commands.keys", "id_command"),
    "init-model": ("node.commands.init_model", "command"),
    "keygen": ("node.commands.keys", "keygen_command"),
    "ledger": ("node.commands.ledger", "command"),
    "rollouts": ("node.commands.rollouts", "command"),
    "run": ("node.commands.run_sign", "group"),
    "runs": ("node.commands.runs", "command"),
    "sim": ("node.commands.sim", "command"),
    "start": ("node.commands.start", "command"),
    "status": ("node.commands.status", "command"),
    "train": ("node.commands.train", "command"),
}
# Commands for which SIGINT or SIGTERM before they run (while the command still loads) is
# a clean stop, exit 0: a node's start-up can be stopped at any moment.
STOP_CLEANLY = frozenset({"start"})


def command_path(ctx: click.Context | None) -> str:
    """`swarm-node <command>` for a context, whatever name the program was started by."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["swarm-node", *reversed(names)])


class LazyGroup(click.Group):
    """The command group: commands from `COMMANDS`, imported on lookup; a usage error is
    one line on stderr (exit 2), as every other error."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted."""
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command named `cmd_name`, its module imported now; None if there is none."""
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where
        found = getattr(importlib.import_module(module), attribute)
        assert isinstance(found, click.Command), where
        return found

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the group; usage and click errors become one line on stderr."""
        kwargs["standalone_mode"] = False
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        stop_cleanly = bool(argv) and argv[0] in STOP_CLEANLY
        if stop_cleanly:  # from now on, while the command loads, SIGTERM is a Ctrl-C
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            return super().main(*args, **kwargs)
        except click.UsageError as exc:
            click.echo(
                f"swarm-node: error: {exc.format_message()} (see '{command_path(exc.ctx)} --help')",
                err=True,
            )
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"swarm-node: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            if stop_cleanly:
                click.echo("swarm-node: stopped before it was running", err=True)
                sys.exit(0)
            click.echo("swarm-node: interrupted", err=True)
            sys.exit(130)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="swarm-node")
def cli() -> None:
    """swarm-node: a peer of a decentralized RL training network."""


def main() -> None:
    """The `swarm-node` entry point."""
    sys.exit(cli())


if __name__ == "__main__":
    main()
