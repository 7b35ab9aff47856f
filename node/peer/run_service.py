"""A running peer's run release: serving it (`node.exchange.runs`), pulling newer ones from
the peers it connects to, adopting what `protocol.run_manifest.check` allows, and keeping
the adopted release and the trusted authority in the node's data directory.

Files beside the node's data (one node, one run):

    run_release.bin   the newest release this node adopted (envelope bytes)
    run_authority     the authority's peer id this node trusts (pinned on first use)

An adopted release is served from then on, so an update spreads peer by peer; its trainer
and validator keys apply at once (who may publish and judge), the other settings it
changes when the node next starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import trio

from node.exchange import runs as run_exchange
from node.host.host import PeerError, PeerEvent
from node.peer.ports import RunPeer
from protocol import penalties
from protocol import run_manifest as rm
from protocol.identity import peer_id_from_b58, peer_id_to_b58
from protocol.wire import RunRelease

log = logging.getLogger("swarm.run")

RELEASE_FILE = "run_release.bin"
AUTHORITY_FILE = "run_authority"
PULL_TIMEOUT_S = 10.0
# A peer that just connected may not serve its run yet (it starts serving once its own
# bootstrap dials are done): ask after a moment, and once more a little later.
PULL_DELAYS_S = (1.0, 3.0)
# What serving a refused release costs the peer that served it, by refusal.
CHARGED = {rm.BAD_SIGNATURE: penalties.BAD_SIGNATURE, rm.MALFORMED: penalties.MALFORMED}
ASK_AGAIN_S = 300.0  # ask one peer for its release at most this often
MAX_PULLS = 4  # pulls at once
MAX_ASKED = 4096  # peers remembered as asked


def read_pin(data_dir: Path) -> bytes | None:
    """The authority this node pinned before, or None."""
    try:
        text = (data_dir / AUTHORITY_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return peer_id_from_b58(text)


def write_pin(data_dir: Path, authority: bytes) -> Path:
    """Pin `authority` as the one this node trusts; returns the file written."""
    path = data_dir / AUTHORITY_FILE
    _write_atomic(path, (peer_id_to_b58(authority) + "\n").encode())
    return path


def load_saved_release(data_dir: Path) -> bytes | None:
    """The release this node adopted before (envelope bytes), or None."""
    with contextlib.suppress(FileNotFoundError):
        return (data_dir / RELEASE_FILE).read_bytes()
    return None


def save_release(data_dir: Path, data: bytes) -> None:
    """Keep `data` as the release this node adopted."""
    _write_atomic(data_dir / RELEASE_FILE, data)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def newest_release(
    candidates: list[bytes | None], pin: bytes | None
) -> tuple[bytes, RunRelease] | None:
    """The newest of `candidates` that `check` adopts in turn (None: none does)."""
    best: tuple[bytes, RunRelease] | None = None
    for data in candidates:
        if data is None:
            continue
        verdict = rm.check(data, pin, best[1] if best else None)
        if isinstance(verdict, rm.Adopt):
            best = (data, verdict.release)
            pin = pin or verdict.release.authority
    return best


class RunService:
    """Serves this peer's run on `/swarm-rl/runs/1` and adopts newer releases of it."""

    def __init__(self, peer: RunPeer, release: bytes | None, pin: bytes | None = None) -> None:
        self.peer = peer
        self.release: RunRelease | None = None
        self.data = rm.encode_unsigned(peer.manifest)
        self.pin = pin
        if release is not None:
            verdict = rm.check(release, pin, None)
            if not isinstance(verdict, rm.Adopt):
                raise ValueError(f"the run release given is refused: {verdict}")
            self.release, self.data = verdict.release, release
            self.pin = pin or verdict.release.authority
        self.counters: Counter[str] = Counter()
        self._asked: OrderedDict[str, float] = OrderedDict()
        self._pulls = 0
        run_exchange.serve_runs(
            peer.host,
            lambda: [run_exchange.ServedRun(self.data, self.summary())],
            peer.bad_request,
            self._refused,
        )
        peer.host.on_peer_event(self._on_peer_event)
        for other in peer.host.connected_peers():  # connected before this service started
            self._on_peer_event(PeerEvent("connected", other))

    def summary(self) -> dict[str, Any]:
        """What `swarm-node runs` shows for this peer's run."""
        peer = self.peer
        roles: Counter[str] = Counter(peer.cfg.roles)
        for other in peer.host.connected_peers():
            roles.update(peer.discovery.book.roles(other))
        release = self.release
        return {
            "run": peer.run_id,
            "model": peer.manifest.model,
            "policy_version": peer.policy_version,
            "manifest_version": release.manifest_version if release else 0,
            "authority": peer_id_to_b58(release.authority) if release else "",
            "peers": dict(roles),
            "time_ms": int(time.time() * 1000),
        }

    def _refused(self, _peer: str) -> None:
        self.counters["run_directory_refused"] += 1

    def _on_peer_event(self, event: PeerEvent) -> None:
        if event.kind != "connected" or self.release is None or self._pulls >= MAX_PULLS:
            return
        now = time.monotonic()
        if now - self._asked.get(event.peer, -ASK_AGAIN_S) < ASK_AGAIN_S:
            return
        self._asked[event.peer] = now
        self._asked.move_to_end(event.peer)
        while len(self._asked) > MAX_ASKED:
            self._asked.popitem(last=False)
        self.peer.spawn(self._pull, event.peer)

    async def _pull(self, who: str) -> None:
        self._pulls += 1
        try:
            for delay in PULL_DELAYS_S:
                await trio.sleep(delay)
                if await self._pull_once(who):
                    return
        finally:
            self._pulls -= 1

    async def _pull_once(self, who: str) -> bool:
        """Ask `who` for its release once; whether it answered."""
        try:
            with trio.move_on_after(PULL_TIMEOUT_S):
                runs = await run_exchange.fetch_runs(self.peer.host, who)
                for served in runs:
                    if served.summary["run"] == self.peer.run_id:
                        self.consider(served.release, who)
                return True
        except run_exchange.BadResponse as exc:
            self.peer.bad_request(who, f"bad run directory answer: {exc}")
            return True
        except PeerError as exc:
            log.debug("run: %s did not answer for its run release: %s", who[:12], exc)
        return False

    def _charge(self, verdict: rm.Refuse, source: str) -> None:
        """A release whose signature fails, or that is no release at all, was forged or
        broken by whoever handed it over (honest peers serve only releases they checked):
        it pays as for any forged message. Foreign, unsigned, older or other-run releases
        may come from an honest peer of another run: refused, free."""
        offence = CHARGED.get(verdict.reason)
        if offence is not None:
            self.peer.report(source, offence.cost, str(verdict), offence=offence.name)

    def consider(self, data: bytes, source: str) -> rm.Adopt | rm.Refuse:
        """Check a release `source` holds; adopt it if `check` says so, else log why not."""
        verdict = rm.check(data, self.pin, self.release)
        if isinstance(verdict, rm.Refuse):
            self.counters[f"run_release_refused_{verdict.reason.replace(' ', '_')}"] += 1
            self._charge(verdict, source)
            quiet = data == self.data  # the same release again: nothing to say
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "run: refused the run manifest %s holds: %s",
                source[:12],
                verdict,
            )
            return verdict
        self.release, self.data = verdict.release, data
        self.counters["run_release_adopted"] += 1
        manifest = verdict.release.manifest
        self.peer.admission.set_run_keys(
            frozenset(manifest.trainer_keys), frozenset(manifest.validator_keys)
        )
        with contextlib.suppress(OSError):
            save_release(self.peer.cfg.data_dir, data)
        log.warning(
            "run: adopted run manifest version %d of %r from %s (authority %s); its trainer "
            "and validator keys apply now, other changed settings at the next start",
            verdict.release.manifest_version,
            manifest.run_id,
            source[:12],
            peer_id_to_b58(verdict.release.authority),
        )
        return verdict
