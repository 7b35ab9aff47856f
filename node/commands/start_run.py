"""Which run `swarm-node start` joins: from the run file (`--run`), or found on the
network (`--join MULTIADDR`), checked against the run authority (`--authority`, else the one
this node pinned before, else trust on first use, said loudly and written beside the
node's data).

A release adopted earlier (`node.peer.run_service`: `run_release.bin`) is used when it is newer
than what the run file or the bootstrap peers offer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.console import sayer
from node.errors import CommandError
from node.run_file import load_run_release
from protocol import run_manifest as rm
from protocol.errors import LocalProtocolError
from protocol.identity import Identity, peer_id_from_b58, peer_id_to_b58
from protocol.wire import RunManifest

_say = sayer(stdout=True)
JOIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunChoice:
    """The manifest to run, its signed release (None: an unsigned run file) and the
    authority to require of later releases."""

    manifest: RunManifest
    release: bytes | None
    pin: bytes | None


def parse_authority(text: str | None) -> bytes | None:
    """`--authority PEER_ID` as raw peer id bytes (None when not given)."""
    if not text:
        return None
    try:
        return peer_id_from_b58(text)
    except LocalProtocolError as exc:
        raise CommandError(f"--authority: {exc}") from None


def from_run_file(path: Path, ddir: Path, flag: bytes | None) -> RunChoice:
    """The run file's manifest (and release), or a newer release adopted before."""
    from node.peer.run_service import (  # deferred: heavy import
        load_saved_release,
        newest_release,
        read_pin,
    )

    manifest, release = load_run_release(path)
    if release is None:
        return RunChoice(manifest, None, flag)
    pin = _pin(flag, read_pin(ddir), ddir)
    file_verdict = rm.check(release, pin, None)
    if isinstance(file_verdict, rm.Refuse):
        raise CommandError(f"--run {path}: {file_verdict}")
    best = newest_release([release, load_saved_release(ddir)], file_verdict.release.authority)
    assert best is not None
    data, chosen = best
    if data != release:
        _say(
            f"  run: using run manifest version {chosen.manifest_version} adopted earlier "
            f"(the run file has version {file_verdict.release.manifest_version})"
        )
    return RunChoice(chosen.manifest, data, chosen.authority)


def _pin(flag: bytes | None, remembered: bytes | None, ddir: Path) -> bytes | None:
    from node.peer.run_service import AUTHORITY_FILE  # deferred: heavy import

    pin = rm.choose_pin(flag, remembered)
    if isinstance(pin, rm.Refuse):
        raise CommandError(
            f"{pin.detail}; remove {ddir / AUTHORITY_FILE} to trust another authority"
        )
    return pin.authority


def from_network(addrs: list[str], ddir: Path, flag: bytes | None, settings: Any) -> RunChoice:
    """Fetch the run's release from the bootstrap peers, check it, pin on first use."""
    from node.peer.run_service import (  # deferred: heavy import
        AUTHORITY_FILE,
        load_saved_release,
        newest_release,
        read_pin,
        save_release,
        write_pin,
    )

    try:
        remembered = read_pin(ddir)
    except LocalProtocolError as exc:
        raise CommandError(f"{ddir / AUTHORITY_FILE}: {exc}") from None
    pin = _pin(flag, remembered, ddir)
    saved = newest_release([load_saved_release(ddir)], pin)
    if saved is not None and pin is None:
        pin = saved[1].authority  # a release this node adopted before: its authority is trusted
    choice = trio.run(_fetch, addrs, pin, settings, saved[1] if saved else None)
    for addr, reason in choice.refusals.items():
        _say(f"  join: {addr}: {reason}")
    if pin is None:
        _refuse_conflicts(choice)
    if choice.release is None:
        untrusted = (rm.FOREIGN, rm.UNSIGNED, rm.BAD_SIGNATURE, rm.MALFORMED, rm.OTHER_RUN)
        contradicted = any(r.startswith(untrusted) for r in choice.refusals.values())
        if saved is None or (contradicted and not choice.confirmed):
            why = "; ".join(f"{a}: {r}" for a, r in choice.refusals.items()) or "no answer"
            raise CommandError(
                f"--join: no bootstrap peer served a run this node can trust ({why})"
            )
        confirmed = f", confirmed by {', '.join(choice.confirmed)}" if choice.confirmed else ""
        _say(
            f"  join: using the run manifest version {saved[1].manifest_version} adopted "
            f"earlier{confirmed}"
        )
        return RunChoice(saved[1].manifest, saved[0], saved[1].authority)
    release = choice.release
    assert release is not None
    with contextlib.suppress(OSError):
        save_release(ddir, choice.data)
    if choice.first_use:
        path = write_pin(ddir, release.authority)
        _say(
            "  !! TRUST ON FIRST USE: nothing pinned this run's authority, so this node now trusts"
        )
        _say(
            f"  !! {peer_id_to_b58(release.authority)} (run {release.manifest.run_id!r}, "
            f"from {choice.source}),"
        )
        _say(f"  !! written to {path}; a manifest signed by any other key will be refused.")
        _say("  !! Check this id with the run's operator, or pass --authority PEER_ID.")
    _say(
        f"  join: run {release.manifest.run_id!r} manifest version {release.manifest_version}, "
        f"authority {peer_id_to_b58(release.authority)} (from {choice.source})"
    )
    return RunChoice(release.manifest, choice.data, release.authority)


def _refuse_conflicts(choice: Any) -> None:
    """A first join (nothing pinned, nothing held) refuses a run id that the bootstrap
    peers serve under more than one authority: whoever answers first must not decide."""
    run_id = choice.release.manifest.run_id if choice.release is not None else None
    found = [c for c in choice.conflicts if run_id is None or c.run_id == run_id]
    if found:
        raise CommandError(
            f"--join: {'; '.join(str(c) for c in found)}. Nothing pinned here says which is "
            "the run's: check the authority with the run's operator and pass --authority PEER_ID"
        )


async def _fetch(addrs: list[str], pin: bytes | None, settings: Any, held: Any) -> Any:
    """Ask every bootstrap address at once (each under its own deadline) from a
    short-lived host of a throwaway identity."""
    from node import join  # deferred: heavy import
    from node.host.host import open_host  # deferred: heavy import

    answers: list[join.Answer] = []
    with trio.move_on_after(JOIN_TIMEOUT_S):
        async with open_host(
            Identity.generate().private_bytes(), ["/ip4/127.0.0.1/tcp/0"], settings
        ) as host:
            answers = await join.ask_all(host, addrs)
    return join.choose(answers, pin, held=held)
