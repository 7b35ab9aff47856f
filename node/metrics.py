"""`--metrics HOST:PORT`: the running node's figures as a Prometheus text endpoint, and
its status page.

`render(status)` turns the node's status (what `swarm-node start` writes to status.json
each second: `Peer.stats()` plus the role's status) into the Prometheus text format,
version 0.0.4; `serve(listener, status, history)` answers `GET /metrics`, and `GET /`
(the status page, `node.dashboard.PAGE`) and `GET /history.json` (its figures over time)
when given a history (anything else: 404) on
an already bound trio listener, one short HTTP/1.0 exchange per connection under a
deadline, at most MAX_SCRAPES at once (more are closed unanswered), so a scraper that
stalls, floods or sends garbage costs a few connections, nothing more.

Series (all prefixed `swarm_`): `peers`, `known_peers`, `policy_version`,
`uptime_seconds`, `outbox_pending`, `pull_pending` (queue depths), `rtt_ms_median`,
`events_total{event}` (every node counter: rollouts and verdicts stored, pulls, hellos,
peer events...), `rejected_total{reason}`, `delivery{state}` (own rollouts produced,
delivered, pending, too stale, audited, refused, trained, awaiting audit, trained
unaudited: `Store.own_work`), `role{field}` (the role's numbers: rollouts produced,
audits passed and failed, verified...), `weights_installed_versions`,
`weights_uploaded_bytes_total`, `weights_events_total{event}` (bytes downloaded, shards
served and verified...), `peers_banned`, `dropped_by_peers`, `refused_by_peers` and
`refused_until` (what peers told us), `reachable` (AutoNAT), `connected_peers{path}`
(direct or relayed), `relay_bytes_total`, `relay_reservations`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio

from node.dashboard import PAGE, History

MAX_REQUEST_BYTES = 4096
IO_DEADLINE_S = 5.0
MAX_SCRAPES = 8  # answered at once; more connections are closed unanswered


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(v):
        return float(v)
    return None


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(status: dict[str, Any]) -> str:
    """The Prometheus text exposition of a node status dict."""
    out: list[str] = []

    def series(name: str, kind: str, help_: str, values: list[tuple[dict[str, str], Any]]) -> None:
        rows = [(labels, n) for labels, v in values if (n := _num(v)) is not None]
        if not rows:
            return
        out.append(f"# HELP swarm_{name} {help_}")
        out.append(f"# TYPE swarm_{name} {kind}")
        for labels, n in rows:
            lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"swarm_{name}{{{lab}}} {n:g}" if lab else f"swarm_{name} {n:g}")

    for key, help_ in (
        ("peers", "connected peers"),
        ("known_peers", "peers in the address book"),
        ("policy_version", "policy version in use"),
        ("outbox_pending", "messages queued to publish"),
        ("pull_pending", "bodies waiting to be pulled"),
        ("rtt_ms_median", "median heartbeat round trip to peers, ms"),
    ):
        series(key, "gauge", help_, [({}, status.get(key))])
    series(
        "uptime_seconds", "gauge", "seconds since the node started", [({}, status.get("uptime_s"))]
    )
    for name, kind, help_, section, label in (
        ("events_total", "counter", "node events by kind", "counters", "event"),
        (
            "rejected_total",
            "counter",
            "messages refused by admission, by reason",
            "rejected",
            "reason",
        ),
        ("delivery", "gauge", "own rollouts by what became of them", "delivery", "state"),
        (
            "role",
            "gauge",
            "the role's figures (rollouts produced, audits passed/failed, ...)",
            "role_status",
            "field",
        ),
    ):
        values = status.get(section) or {}
        series(name, kind, help_, [({label: k}, v) for k, v in sorted(values.items())])
    weights = status.get("weights") or {}
    series(
        "weights_installed_versions",
        "gauge",
        "policy versions installed",
        [({}, len(weights.get("installed") or []))] if weights else [],
    )
    series(
        "weights_uploaded_bytes_total",
        "counter",
        "weight shard bytes uploaded",
        [({}, weights.get("uploaded_bytes"))],
    )
    series(
        "weights_events_total",
        "counter",
        "weight exchange events by kind",
        [({"event": k}, v) for k, v in sorted((weights.get("counters") or {}).items())],
    )
    series("peers_banned", "gauge", "peers banned now", [({}, status.get("banned"))])
    series(
        "dropped_by_peers",
        "gauge",
        "peers that keep closing our connections (node.peer.dropped_by)",
        [({}, len(status.get("dropped_by") or {}))],
    )
    told = [d for d in (status.get("dropped_by") or {}).values() if d.get("told")]
    series(
        "refused_by_peers",
        "gauge",
        "peers that told us they refuse us (node.host.goodbye)",
        [({}, len(told))],
    )
    series(
        "refused_until",
        "gauge",
        "latest end (unix time) of a refusal a peer told us about",
        [({}, max(d["until"] for d in told))] if told else [],
    )
    series(
        "reachable",
        "gauge",
        "AutoNAT verdict: 1 public, 0 private (absent while unknown)",
        [({}, {"public": 1, "private": 0}.get(status.get("reachability", "")))],
    )
    series(
        "connected_peers",
        "gauge",
        "connected peers by path (direct or through a relay)",
        [({"path": k}, status.get(f"{k}_peers")) for k in ("direct", "relayed")],
    )
    series(
        "relay_bytes_total",
        "counter",
        "bytes this relay forwarded between circuit ends",
        [({}, status.get("relay_bytes"))],
    )
    series(
        "relay_reservations",
        "gauge",
        "peers holding a slot on this relay",
        [({}, status.get("relay_reservations"))],
    )
    return "\n".join(out) + "\n"


async def serve(
    listener: trio.SocketListener,
    status: Callable[[], dict[str, Any]],
    history: History | None = None,
) -> None:
    """Answer scrapes (and, given a history, status-page requests) on `listener` until
    cancelled."""

    def respond(path: bytes) -> tuple[bytes, bytes, bytes]:
        if path == b"/metrics":
            return b"200 OK", b"text/plain; version=0.0.4", render(status()).encode()
        if history is not None and path in (b"/", b"/index.html"):
            return b"200 OK", b"text/html; charset=utf-8", PAGE.encode()
        if history is not None and path == b"/history.json":
            return b"200 OK", b"application/json", history.to_json()
        return b"404 Not Found", b"text/plain", b"not found: try /metrics or /\n"

    slots = trio.Semaphore(MAX_SCRAPES)

    async def one(stream: trio.SocketStream) -> None:
        if slots.value == 0:  # a flood of connections: refused, not queued
            await trio.aclose_forcefully(stream)
            return
        async with slots:
            await answer(stream)

    async def answer(stream: trio.SocketStream) -> None:
        with trio.move_on_after(IO_DEADLINE_S):
            try:
                request = b""
                while b"\r\n\r\n" not in request and b"\n\n" not in request:
                    chunk = await stream.receive_some(MAX_REQUEST_BYTES)
                    if not chunk:
                        break
                    request += chunk
                    if len(request) > MAX_REQUEST_BYTES:
                        break
                line = request.split(b"\n", 1)[0].split()
                path = line[1].split(b"?")[0] if len(line) >= 2 and line[0] == b"GET" else b""
                code, kind, body = respond(path)
                head = b"HTTP/1.0 %s\r\nContent-Type: %s\r\n" % (code, kind)
                head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                await stream.send_all(head + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await trio.aclose_forcefully(stream)

    await trio.serve_listeners(one, [listener])
