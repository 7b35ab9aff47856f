"""The simulated swarm: virtual peers running the real admission rules over the models.

What lives here: `Workload` (who publishes what, how often, who pulls bodies, the run's
staleness bound and version cadence) and `Swarm`, which wires the event loop, the
network, GossipSub routers, churn and adversaries around one `protocol.admission.Admission`
per peer (with its `protocol.peer_score.PeerScores`). Rules come from `protocol/`; this
module only turns their actions into scheduled sends:

    MessageReceived -> Reject      count it; a penalty marks the router for a score check
                    -> Forward     send to mesh peers except the sender and the signer
                    -> Deliver     record latency vs lower bound; queue a body pull
                    -> Disconnect  close the connection, drop from the mesh
                    -> Ban         count it (the ban itself lives in PeerScores)

`warm_start`: every peer's admission first learns all keys as signers it stored before
(`Known`, as the node's restart does); without it a swarm starts cold: every view is young
and takes the new signers within `young_view_signers` (`protocol.admission`).

Header gossip + body pull, as the real node does: headers travel through the mesh;
peers with a puller role (validators, the trainer) pull the body by the node's own
schedule (`protocol.body_pull`: the producer first, then the forwarder, then other
connected peers; `pull_tries` attempts; silence past `pull_timeout_s` counts as an answer,
as a timed-out request on an open stream does in the node). Version cadence (`version_interval_s` > 0): the trainer (peer 0)
announces version v+1 by gossip (`Kind.WEIGHT_ANNOUNCE`, trainer key in the run rules);
a worker adopts it after fetching `checkpoint_bytes` at its downlink speed (the shard
swarm itself is `swarm_sim.broadcast`), and tags later rollouts with it; the trainer's
admission refuses rollouts older than S (`Reason.STALE`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import cast

from protocol import body_pull as bp
from protocol import penalties
from protocol.accounting import WITHHELD_PENALTY, GapCharges
from protocol.admission import (
    Admission,
    AdmissionConfig,
    Ban,
    BodyMissing,
    Deliver,
    Disconnect,
    Forward,
    Kind,
    Known,
    MessageReceived,
    Misbehaved,
    PeerConnected,
    Reject,
    RunRules,
    Tick,
    VersionChanged,
)
from protocol.peer_score import PeerId
from swarm_sim.adversary import AdversaryConfig, Behaviour
from swarm_sim.churn import ChurnConfig
from swarm_sim.core import EventLoop, derive_rng, gc_paused
from swarm_sim.gossipsub import GossipConfig, Router
from swarm_sim.messages import MessageBook, SimMessage, peer_ids
from swarm_sim.metrics import Metrics
from swarm_sim.network import NetConfig, Network

__all__ = ["Swarm", "Workload"]

HONEST = Behaviour.HONEST


class _Everyone:
    """Every simulated peer has an address its neighbours can dial."""

    def __contains__(self, peer: object) -> bool:
        return True


_EVERYONE = _Everyone()
SEEN, ADMITTED = 2, 1  # SimMessage.got[peer]: 0 never seen, 2 seen (refused), 1 admitted


@dataclass(frozen=True, slots=True)
class Workload:
    """What the simulated run does: peers, duration, publishing rates, roles and pulls."""

    peers: int = 100
    duration_s: float = 300.0
    publish_interval_s: float = 60.0  # each worker publishes one rollout per interval
    burst: int = 1  # ... as generation batches: `burst` rollouts at once every burst intervals
    publishers: float = 1.0  # share of peers (besides the trainer, peer 0) that publish
    header_bytes: int = 600
    body_bytes: int = 20_000
    pullers: float = 0.02  # share of peers that pull every body (validators); min 1
    lifetime_s: float = 30.0  # a message's delivery is judged at t0 + lifetime
    connect_to: int = 12  # connections a peer opens when it joins
    pull_timeout_s: float = 5.0
    pull_tries: int = bp.PullConfig().attempts
    max_staleness: int = 2
    version_interval_s: float = 0.0  # 0: no new versions
    checkpoint_bytes: int = 30_000_000  # what a worker fetches to adopt a version
    tick_s: float = 30.0  # admission Tick per peer (lifts bans)
    sample_s: float = 10.0  # how often time series are sampled
    # A swarm that has run before: every peer starts knowing every peer's key as a signer
    # it admitted (what the node restores from its store after a restart, `Known`), so
    # no header is refused as a new identity. False: a cold start (see docs/SIMULATOR.md).
    warm_start: bool = False
    admission: AdmissionConfig = AdmissionConfig(
        dedup_entries=4096,
        dedup_ttl_s=300.0,
        replay_window=64,
        max_signers=1024,
        max_rate_keys=1024,
    )

    def __post_init__(self) -> None:
        if self.peers < 2 or self.duration_s <= 0 or self.publish_interval_s <= 0:
            raise ValueError("a workload needs >= 2 peers, a duration and a publish interval")
        if not (0 <= self.publishers <= 1 and 0 <= self.pullers <= 1):
            raise ValueError("publishers and pullers are shares in [0, 1]")
        if self.lifetime_s <= 0 or self.connect_to < 1 or self.pull_tries < 1 or self.burst < 1:
            raise ValueError("lifetime_s > 0, connect_to >= 1, pull_tries >= 1, burst >= 1")


class Swarm:
    """Every virtual peer, the models between them, and what they measured."""

    def __init__(
        self,
        wl: Workload,
        net: NetConfig | None = None,
        gossip: GossipConfig | None = None,
        churn: ChurnConfig | None = None,
        adversary: AdversaryConfig | None = None,
        seed: int = 0,
    ) -> None:
        self.wl, self.seed = wl, seed
        self.gcfg = gossip or GossipConfig()
        self.churn = churn or ChurnConfig()
        self.adv = adversary or AdversaryConfig()
        n = self.n = wl.peers
        self.loop = EventLoop()
        self.rng = derive_rng(seed, "swarm")
        self._churn_rng = derive_rng(seed, "churn")
        self._adv_rng = derive_rng(seed, "adversary")
        self.net = Network(self.loop, net or NetConfig(), n, derive_rng(seed, "network"))
        self.ids = peer_ids(n, seed)
        self.index: dict[PeerId, int] = {pid: i for i, pid in enumerate(self.ids)}
        self.book = MessageBook("sim-run", self.ids)
        self.run_rules = RunRules("sim-run", wl.max_staleness, frozenset({self.ids[0]}))
        rules = self.book.rules()
        self.adm = [Admission(self.run_rules, wl.admission, rules=rules) for _ in range(n)]
        if wl.warm_start:
            known = Known(Kind.ROLLOUT_HEADER, (), 0.0, signers=tuple(self.ids))
            for adm in self.adm:
                adm.handle(known)
        self.routers = [Router(self.gcfg.history_gossip) for _ in range(n)]
        self.behaviour = self.adv.assign(n, self._adv_rng, exclude={0})
        order = list(range(1, n))
        self.rng.shuffle(order)
        n_pull = max(1, round(wl.pullers * n))
        self.puller = bytearray(n)
        self.puller[0] = 1  # the trainer pulls every body
        for p in order[: n_pull - 1]:
            self.puller[p] = 1
        self.publisher = bytearray(n)
        self.rng.shuffle(order)
        for p in order[: round(wl.publishers * (n - 1))]:
            self.publisher[p] = 1
        self.seq = [0] * n
        self.version = [0] * n  # each peer's adopted policy version
        self.session_start = [0.0] * n
        self.online_list: list[int] = []  # online peers, for sampling (order deterministic)
        self._online_pos: dict[int, int] = {}
        self.bodies: dict[int, set[int]] = {}  # message id -> peers holding the body
        self._pull_cfg = bp.PullConfig(attempts=wl.pull_tries)
        self.pulls: dict[int, bp.PullSchedule] = {}  # puller -> its body-pull schedule
        self._pull_msgs: dict[int, SimMessage] = {}  # mid -> message, while some peer pulls it
        self._pull_refs: dict[int, int] = {}  # mid -> pullers pulling it
        self._pulling: dict[int, set[int]] = {}  # puller -> mids its schedule holds
        self._fetch_token = 0
        self._asked: dict[
            tuple[int, int], tuple[int, int]
        ] = {}  # (puller, mid) -> (fetch token, source)
        self._armed: dict[int, float] = {}  # puller -> time of its next scheduled look
        self.recent: list[SimMessage] = []  # published, not yet closed
        self.old: list[SimMessage] = []  # closed (for replayers), bounded
        self.m = Metrics()
        self._trainer_version = 0
        self.announce_times: dict[int, float] = {}
        self.gaps = GapCharges()  # the trainer's dense-counter accounting (protocol.accounting)
        self.counter = [0] * n  # each producer's next assignment counter
        self.gap_charged: set[int] = set()  # producers the trainer charged for withheld work

    # -- helpers --------------------------------------------------------------------

    def _score(self, me: int):
        """`me`'s score of a peer; 0.0 for peers it never penalised (see Router.suspect)."""
        scores, ids, now = self.adm[me].scores, self.ids, self.loop.now
        suspect = self.routers[me].suspect
        return lambda p: scores.score(ids[p], now) if p in suspect else 0.0

    def _set_online(self, p: int, up: bool) -> None:
        self.net.set_online(p, up)
        if up:
            self._online_pos[p] = len(self.online_list)
            self.online_list.append(p)
        else:
            i = self._online_pos.pop(p)
            last = self.online_list.pop()
            if last != p:
                self.online_list[i] = last
                self._online_pos[last] = i

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Bring every peer online at t=0 (in index order) and schedule the workload."""
        wl, loop, rng = self.wl, self.loop, self.rng
        for p in range(self.n):
            self._join(p)
        loop.at(self.gcfg.heartbeat_s, self._heartbeat)
        loop.at(wl.tick_s, self._tick)
        loop.at(0.0, self._sample)
        for p in range(1, self.n):
            if self.publisher[p] and self.behaviour[p] in (
                HONEST,
                Behaviour.WITHHOLD,
                Behaviour.SHOP,
            ):
                loop.at(rng.uniform(1.0, wl.publish_interval_s), self._publish_loop, p)
            elif self.behaviour[p] != HONEST:
                loop.at(self.adv.start_s + rng.random(), self._misbehave, p)
        if wl.version_interval_s > 0:
            loop.at(wl.version_interval_s, self._new_version)

    def _join(self, p: int) -> None:
        now = self.loop.now
        self._set_online(p, True)
        self.session_start[p] = now
        self.routers[p].reset()
        self.m.joins += 1
        ol = self.online_list  # p was just appended: the others are a slice (a C copy)
        others = ol[:-1] if ol[-1] == p else [q for q in ol if q != p]
        want = min(self.wl.connect_to, len(others))
        for q in self.rng.sample(others, want) if others else ():
            self._connect(p, q)
        if self.churn.enabled:
            self.loop.after(self.churn.session_s(self._churn_rng), self._leave, p)
        if self.wl.version_interval_s > 0 and p != 0:
            # A joining peer learns the newest version its new neighbours hold (the node
            # reads it from their hellos, `node.weights.sync`) and fetches it.
            best = max((self.version[q] for q in self.net.conns[p]), default=0)
            if best > self.version[p]:
                self.loop.after(self.wl.checkpoint_bytes / self.net.down[p], self._adopt, p, best)

    def _connect(self, a: int, b: int) -> None:
        if self.adm[a].handle(PeerConnected(self.ids[b], self.loop.now)):
            return  # a has b banned
        if self.adm[b].handle(PeerConnected(self.ids[a], self.loop.now)):
            return
        if self.net.connect(a, b):
            self.routers[a].dirty = self.routers[b].dirty = True

    def _leave(self, p: int) -> None:
        if not self.net.online[p]:
            return
        self.m.leaves += 1
        crashed = self.churn.crashes(self._churn_rng)
        self._set_online(p, False)
        self._drop_pulls(p)
        neighbours = sorted(self.net.conns[p])
        if crashed:
            self.loop.after(self.churn.dead_after_s, self._noticed, p, neighbours)
        else:
            self._noticed(p, neighbours)
        self.loop.after(self.churn.offline_s(self._churn_rng), self._join, p)

    def _noticed(self, p: int, neighbours: list[int]) -> None:
        for q in neighbours:
            if q in self.net.conns[p] and not (self.net.online[p] and self.net.online[q]):
                self._drop_link(p, q)

    def _drop_link(self, a: int, b: int) -> None:
        self.net.disconnect(a, b)
        for x, y in ((a, b), (b, a)):
            r = self.routers[x]
            if y in r.mesh:
                r.mesh.discard(y)
                r.dirty = True

    # -- publishing -----------------------------------------------------------------

    def _next_seq(self, p: int) -> int:
        self.seq[p] += 1
        return self.seq[p]

    def _publish_loop(self, p: int) -> None:
        if self.loop.now >= self.wl.duration_s:
            return  # publishing is over; the run drains
        self.loop.after(self.wl.publish_interval_s * self.wl.burst, self._publish_loop, p)
        if self.net.online[p]:
            for _ in range(self.wl.burst):
                counter = self.counter[p]
                # A shopper makes 1/shop_keep rollouts per interval and publishes one of them.
                keep = self.adv.shop_keep if self.behaviour[p] == Behaviour.SHOP else 1.0
                self.counter[p] += max(1, round(1 / keep))
                self.publish(p, counter=counter)

    def publish(
        self,
        p: int,
        *,
        valid: bool = True,
        body_digest: bytes | None = None,
        counter: int | None = None,
    ) -> SimMessage:
        """`p` signs a new rollout header and sends it to its mesh."""
        wl, now = self.wl, self.loop.now
        msg = self.book.make(
            Kind.ROLLOUT_HEADER,
            p,
            self._next_seq(p),
            now,
            wl.header_bytes,
            self.version[p],
            body_size=wl.body_bytes,
            valid=valid,
            n_peers=self.n,
            body_digest=body_digest,
            counter=counter,
        )
        self.m.messages += 1
        assert msg.got is not None  # `MessageBook.make` gives every new message one
        msg.got[p] = ADMITTED
        self.bodies[msg.mid] = {p}
        self.routers[p].add(msg)
        self.recent.append(msg)
        self.loop.after(wl.lifetime_s, self._close, msg)  # then _forget
        self.net.send_many(
            p,
            sorted(self.routers[p].mesh),
            msg.size,
            "header",
            self._receive,
            p,
            msg,
            self._seen,
            eta=msg.eta,
        )
        return msg

    def _send_msg(self, a: int, b: int, msg: SimMessage, kind: str = "header") -> None:
        self.net.send(a, b, msg.size, kind, self._receive, (b, a, msg), self._seen, eta=msg.eta)

    def _seen(self, b: int, a: int, msg: SimMessage) -> bool:
        got = msg.got
        if got is not None and got[b]:
            self.m.duplicates += 1
            return True
        return False

    def _close(self, msg: SimMessage) -> None:
        """Judge delivery among peers online for the message's whole lifetime."""
        msg.closed = True
        got, start, online, o = msg.got, self.session_start, self.net.online, msg.origin
        assert got is not None  # a message is closed before it is forgotten
        if msg.valid and online[o] and start[o] <= msg.t0 and self.behaviour[o] == HONEST:
            eligible = delivered = 0
            for q in self.online_list:
                if q != o and start[q] <= msg.t0 and self.behaviour[q] == HONEST:
                    eligible += 1
                    delivered += got[q] == ADMITTED
            self.m.close(msg.t0, eligible, delivered)
        self.loop.at(msg.t0 + self.gcfg.seen_ttl_s, self._forget, msg)

    def _forget(self, msg: SimMessage) -> None:
        """The seen-caches let the message go (`GossipConfig.seen_ttl_s` after signing):
        a copy seen later goes to admission again (where replays are caught)."""
        msg.got = msg.eta = None
        self.bodies.pop(msg.mid, None)
        self.old.append(msg)
        if len(self.old) > 1024:
            del self.old[:512]

    # -- receiving ------------------------------------------------------------------

    def _receive(self, b: int, a: int, msg: SimMessage) -> None:
        if msg.got is not None and msg.got[b]:
            self.m.duplicates += 1  # a copy that overtook this one while it waited for CPU
            return
        if not self.net.online[b]:
            self.m.delivered_offline += 1
            return
        now = self.loop.now
        if msg.got is not None:
            msg.got[b] = SEEN  # the router's seen-cache: marked before validation
        pub = msg.publisher
        actions = self.adm[b].handle(
            MessageReceived(
                self.ids[a], msg.kind, msg.token, now, origin=self.ids[pub] if pub >= 0 else None
            )
        )
        for act in actions:
            if isinstance(act, Forward):
                o = msg.origin
                targets = [q for q in sorted(self.routers[b].mesh) if q != a and q != o]
                self.net.send_many(
                    b,
                    targets,
                    msg.size,
                    "header",
                    self._receive,
                    b,
                    msg,
                    self._seen,
                    eta=msg.eta,
                )
            elif isinstance(act, Deliver):
                self._delivered(b, a, msg, now)
            elif isinstance(act, Reject):
                self._rejected(b, a, act)
                if b == 0 and act.late is not None and msg.kind == Kind.ROLLOUT_HEADER:
                    # published, only late: its counter is no gap (as in the real trainer)
                    self._charge(self.gaps.on_rollout(self.ids[msg.origin], msg.counter, 0.0, now))
            elif isinstance(act, Disconnect):
                self._drop_link(b, a)
            elif isinstance(act, Ban):
                self._banned(act.peer)

    def _delivered(self, b: int, a: int, msg: SimMessage, now: float) -> None:
        if msg.got is None:
            return  # admitted after the seen-caches let it go (a replay): not measured
        msg.got[b] = ADMITTED
        self.routers[b].add(msg)
        if msg.kind == Kind.WEIGHT_ANNOUNCE:
            self._announced(b, msg)
            return
        self.m.delivered(now - msg.t0, self.net.min_delay(msg.origin, b, msg.size))
        if b == 0 and msg.kind == Kind.ROLLOUT_HEADER:
            self._charge(self.gaps.on_rollout(self.ids[msg.origin], msg.counter, 0.0, now))
        if self.puller[b] and b != msg.origin:
            self._want(b, a, msg)

    def _charge(self, producers: list[bytes]) -> None:
        """The trainer charges producers whose withheld counters passed the allowance."""
        now = self.loop.now
        for pid in producers:
            q = self.index[pid]
            self.gap_charged.add(q)
            for act in self.adm[0].handle(Misbehaved(pid, WITHHELD_PENALTY, "withheld", now)):
                if type(act) is Disconnect and q in self.net.conns[0]:
                    self._drop_link(0, q)
                elif type(act) is Ban:
                    self._banned(act.peer)

    def _banned(self, peer_id: PeerId) -> None:
        """Count a ban, apart for honest peers and attackers."""
        self.m.bans += 1
        q = self.index.get(peer_id)
        if q is not None and self.behaviour[q] == HONEST:
            self.m.bans_honest += 1

    def _rejected(self, b: int, a: int, act: Reject) -> None:
        self.m.rejects[str(act.reason)] += 1
        if act.penalty < 0:
            self.routers[b].dirty = True
            self.routers[b].suspect.add(a)
            if self.behaviour[a] == HONEST and self.behaviour[b] == HONEST:
                self.m.honest_penalized += 1
                self.m.honest_penalized_reasons[str(act.reason)] += 1

    # -- body pull (rules: protocol.body_pull) ---------------------------------------

    def _want(self, b: int, sender: int, msg: SimMessage) -> None:
        sched = self.pulls.get(b)
        if sched is None:
            sched = self.pulls[b] = bp.PullSchedule(self._pull_cfg)
        if msg.mid in sched:
            return
        sources = (msg.origin, sender) if sender != msg.origin else (msg.origin,)
        sched.handle(bp.Want(msg.mid, sources, self.loop.now, (self.ids[msg.origin], sender)))
        if msg.mid in sched:
            self._pulling.setdefault(b, set()).add(msg.mid)
            self._pull_msgs[msg.mid] = msg
            self._pull_refs[msg.mid] = self._pull_refs.get(msg.mid, 0) + 1
        self._pump(b)

    def _pump(self, b: int) -> None:
        """Send the fetches due now; look again when the next pull is due."""
        sched, now = self.pulls[b], self.loop.now
        self._carry_out(b, sched.handle(bp.Due(now, self.net.conns[b], _EVERYONE)))
        nxt = sched.next_due()
        if nxt is not None and nxt > now and self._armed.get(b, float("inf")) > nxt:
            self._armed[b] = nxt
            self.loop.at(nxt, self._wake, b, nxt)

    def _wake(self, b: int, at: float) -> None:
        if self._armed.get(b) == at:
            del self._armed[b]
        if self.net.online[b] and b in self.pulls:
            self._pump(b)

    def _carry_out(self, b: int, actions: list[bp.Action]) -> None:
        # The simulator's rollout ids and sources are message and peer indices, and every
        # `Want` carries its (signer, sender) origin.
        for act in actions:
            if isinstance(act, bp.Fetch):
                self._fetch(b, act)
            elif isinstance(act, bp.GiveUp):
                self.m.pulls_failed += 1
                mid = cast(int, act.rollout_id)
                self._pulling[b].discard(mid)
                self._unref(mid)
                signer, sender = cast(tuple[bytes, int], act.origin)
                self._body_missing(b, sender, self._pull_msgs_or_none(mid), signer, act.answered)
            elif isinstance(act, bp.Done):
                mid = cast(int, act.rollout_id)
                self._pulling[b].discard(mid)
                self._unref(mid)
            elif isinstance(act, bp.Charge):
                self._misbehaved(b, cast(int, act.peer), act.offence)

    def _pull_msgs_or_none(self, mid: int) -> SimMessage | None:
        return self._pull_msgs.get(mid)

    def _unref(self, mid: int) -> None:
        left = self._pull_refs.get(mid, 1) - 1
        if left > 0:
            self._pull_refs[mid] = left
        else:
            self._pull_refs.pop(mid, None)
            self._pull_msgs.pop(mid, None)

    def _drop_pulls(self, p: int) -> None:
        """A peer that goes offline forgets its pulls (the node's are in memory too)."""
        sched = self.pulls.pop(p, None)
        if sched is None:
            return
        for mid in self._pulling.pop(p, set()):
            self._unref(mid)
            self._asked.pop((p, mid), None)
        self._armed.pop(p, None)

    def _fetch(self, b: int, f: bp.Fetch) -> None:
        self._fetch_token += 1
        token, src = self._fetch_token, cast(int, f.source)
        for mid in cast(tuple[int, ...], f.ids):
            self._asked[(b, mid)] = (token, src)
        self.net.send(
            b,
            src,
            100 + 32 * len(f.ids),
            "pull_request",
            self._serve,
            (src, b, f.ids),
            need_conn=False,
            control=True,
        )
        self.loop.after(self.wl.pull_timeout_s, self._pull_timeout, b, f.ids, src, token)

    def _answer(self, b: int, mid: int, src: int, outcome: bp.Outcome) -> None:
        self._asked.pop((b, mid), None)
        sched = self.pulls.get(b)
        if sched is None or not self.net.online[b]:
            return
        if outcome is not bp.Outcome.SERVED:
            self.m.pull_retries += 1
        self._carry_out(b, sched.handle(bp.Answered(mid, src, outcome, self.loop.now)))
        self._pump(b)

    def _misbehaved(self, b: int, peer: int, offence: str) -> None:
        cost = penalties.BY_NAME[offence].cost
        ev = Misbehaved(self.ids[peer], cost, "body pull", self.loop.now, offence=offence)
        for act in self.adm[b].handle(ev):
            if type(act) is Disconnect:
                self._drop_link(b, peer)
            elif type(act) is Ban:
                self._banned(act.peer)
        self.routers[b].dirty = True
        self.routers[b].suspect.add(peer)
        if self.behaviour[peer] == HONEST and self.behaviour[b] == HONEST:
            self.m.honest_penalized += 1
            self.m.honest_penalized_reasons[offence] += 1

    def _body_missing(
        self, b: int, sender: int, msg: SimMessage | None, signer: bytes, answered: int
    ) -> None:
        """No source served the body: admission charges the signer and the sender when
        some source answered (`BodyMissing`)."""
        origin = self.index[signer]
        rid = hashlib.sha256(msg.token).digest() if msg is not None else signer
        ev = BodyMissing(rid, signer, self.ids[sender], self.loop.now, answered)
        acts = self.adm[b].handle(ev)
        for act in acts:
            if type(act) is Disconnect:
                q = self.index.get(act.peer)
                if q is not None:
                    self._drop_link(b, q)
            elif type(act) is Ban:
                self._banned(act.peer)
        if answered <= 0:
            return  # no evidence: nobody paid
        self.routers[b].dirty = True
        self.routers[b].suspect.update((sender, origin))
        for q in {sender, origin}:
            if self.behaviour[q] == HONEST and self.behaviour[b] == HONEST:
                self.m.honest_penalized += 1
                self.m.honest_penalized_reasons["body_missing"] += 1

    def _serve(self, src: int, b: int, mids: tuple[int, ...]) -> None:
        if self.behaviour[src] == Behaviour.WITHHOLD:
            return  # says nothing: the puller's deadline passes
        for mid in mids:
            msg = self._pull_msgs.get(mid)
            holders = self.bodies.get(mid)
            if msg is None or holders is None or src not in holders:
                # An empty frame: "no body for that id" (node.exchange.rollouts).
                self.net.send(
                    src,
                    b,
                    8,
                    "pull_empty",
                    self._no_body,
                    (b, src, mid),
                    need_conn=False,
                    control=True,
                )
                continue
            size = msg.size + msg.body_size
            self.net.send(src, b, size, "body", self._got_body, (b, src, msg), need_conn=False)

    def _got_body(self, b: int, src: int, msg: SimMessage) -> None:
        if self._asked.get((b, msg.mid), (0, -1))[1] != src:
            return  # already done, given up, or asked of another source since
        now = self.loop.now
        acts = self.adm[b].handle(
            MessageReceived(self.ids[src], Kind.ROLLOUT_RECORD, msg.token, now)
        )
        outcome = bp.Outcome.BAD_BODY
        for act in acts:
            if type(act) is Reject:
                self._rejected(b, src, act)
                if act.reason == "duplicate":
                    outcome = bp.Outcome.SERVED
            elif type(act) is Deliver:
                outcome = bp.Outcome.SERVED
                self.m.pulls_ok += 1
                self.m.body_latency_ms.append((now - msg.t0) * 1000.0)
                size = msg.size + msg.body_size
                self.m.body_bound_ms.append(self.net.min_delay(msg.origin, b, size) * 1000.0)
                holders = self.bodies.get(msg.mid)
                if holders is not None:
                    holders.add(b)
                if b == 0:
                    self.m.used_at_trainer += 1
        if b == 0 and any(type(x) is Reject and x.reason == "stale" for x in acts):
            self.m.stale_at_trainer += 1
        self._answer(b, msg.mid, src, outcome)

    def _no_body(self, b: int, src: int, mid: int) -> None:
        if self._asked.get((b, mid), (0, -1))[1] == src:
            self._answer(b, mid, src, bp.Outcome.EMPTY)

    def _pull_timeout(self, b: int, mids: tuple[int, ...], src: int, token: int) -> None:
        for mid in mids:
            if self._asked.get((b, mid), (0, -1))[0] == token:
                self._answer(b, mid, src, bp.Outcome.SILENT)

    # -- heartbeat, ticks, samples ---------------------------------------------------

    def _heartbeat(self) -> None:
        cfg, now, net = self.gcfg, self.loop.now, self.net
        self.loop.at(now + cfg.heartbeat_s, self._heartbeat)
        d_lo, d_hi, routers, rng = cfg.d_lo, cfg.d_hi, self.routers, self.rng
        for p in list(self.online_list):
            r = routers[p]
            # A router needs a beat when dirty, advertising, or off its mesh bounds; most
            # are idle most beats.
            if not r.dirty and not r.live and d_lo <= len(r.mesh) <= d_hi:
                continue
            score = self._score(p)
            if r.dirty or not d_lo <= len(r.mesh) <= d_hi:
                graft, prune = r.maintain(net.conns[p], score, cfg, rng, now)
            else:
                graft = prune = ()  # what maintain returns for a clean mesh of a good size
            for q in graft:
                self.m.grafts += 1
                if p in routers[q].suspect and self.adm[q].scores.score(self.ids[p], now) < 0:
                    r.mesh.discard(q)  # q refuses the graft of a peer it scores negative
                else:
                    routers[q].mesh.add(p)
                    routers[q].dirty = True
            for q in prune:
                self.m.prunes += 1
                routers[q].mesh.discard(p)
                routers[q].dirty = True
            targets = r.gossip_targets(net.sorted_conns(p), score, cfg, rng)
            if targets:
                ids = [m for w in r.mcache for m in w if not m.closed]
                if ids:
                    size = cfg.control_bytes + cfg.id_bytes * len(ids)
                    self.m.ihave += len(targets)
                    net.send_many(
                        p,
                        targets,
                        size,
                        "ihave",
                        self._on_ihave,
                        p,
                        ids,
                        self._ihave_idle,
                        control=True,
                    )
            r.shift()

    @staticmethod
    def _ihave_idle(b: int, a: int, msgs: list[SimMessage]) -> bool:
        """An IHAVE whose ids `b` has all seen: its handler would do nothing (seen marks
        only grow), so the network counts its bytes without an event."""
        for m in msgs:
            got = m.got
            if got is not None and not got[b]:
                return False
        return True

    def _on_ihave(self, b: int, a: int, msgs: list[SimMessage]) -> None:
        want = [m for m in msgs if m.got is not None and not m.got[b]]
        if want:
            size = self.gcfg.control_bytes + self.gcfg.id_bytes * len(want)
            self.net.send(b, a, size, "iwant", self._on_iwant, (a, b, want), control=True)

    def _on_iwant(self, a: int, b: int, msgs: list[SimMessage]) -> None:
        for m in msgs:
            if m.got is not None and m.got[a] == ADMITTED:
                self.m.iwant_served += 1
                self._send_msg(a, b, m, "iwant_reply")

    def _tick(self) -> None:
        now = self.loop.now
        self.loop.at(now + self.wl.tick_s, self._tick)
        tick, adm = Tick(now), self.adm
        for p in self.online_list:
            if adm[p].handle(tick):
                self.routers[p].dirty = True
        self._charge(self.gaps.on_time(now))
        self.recent = [m for m in self.recent if not m.closed]

    def _sample(self) -> None:
        now = self.loop.now
        self.loop.at(now + self.wl.sample_s, self._sample)
        if any(self.behaviour):
            slots = sum(
                1
                for p in self.online_list
                if self.behaviour[p] == HONEST
                for q in self.routers[p].mesh
                if self.behaviour[q] != HONEST
            )
            self.m.adversary_mesh.append((round(now, 3), slots))
        if self.wl.version_interval_s > 0:
            vs = sorted(
                self.version[p] for p in self.online_list if p != 0 and self.behaviour[p] == HONEST
            )
            if vs:  # (t, lowest, the 1st percentile, highest) version among workers
                self.m.version_spread.append((round(now, 3), vs[0], vs[len(vs) // 100], vs[-1]))

    # -- versions -------------------------------------------------------------------

    def _new_version(self) -> None:
        if self.loop.now >= self.wl.duration_s:
            return
        self.loop.after(self.wl.version_interval_s, self._new_version)
        now = self.loop.now
        self._trainer_version += 1
        v = self._trainer_version
        self.version[0] = v
        self.adm[0].handle(VersionChanged(v, now))
        msg = self.book.make(
            Kind.WEIGHT_ANNOUNCE, 0, self._next_seq(0), now, 1200, v, n_peers=self.n
        )
        assert msg.got is not None  # `MessageBook.make` gives every new message one
        msg.got[0] = ADMITTED
        self.announce_times[v] = now
        self.loop.after(self.wl.lifetime_s * 4, self._close_version, msg, v)
        for q in sorted(self.routers[0].mesh):
            self._send_msg(0, q, msg, "announce")

    def _announced(self, b: int, msg: SimMessage) -> None:
        fetch = self.wl.checkpoint_bytes / self.net.down[b]
        self.loop.after(fetch, self._adopt, b, msg.version)

    def _adopt(self, b: int, v: int) -> None:
        if self.net.online[b] and v > self.version[b]:
            self.version[b] = v
            self.adm[b].handle(VersionChanged(v, self.loop.now))

    def _close_version(self, msg: SimMessage, v: int) -> None:
        msg.got = msg.eta = None
        msg.closed = True

    # -- adversaries ----------------------------------------------------------------

    def _misbehave(self, p: int) -> None:
        if self.loop.now >= self.wl.duration_s:
            return
        beh, adv, rng = self.behaviour[p], self.adv, self._adv_rng
        rate = {
            Behaviour.SPAM: adv.spam_rate,
            Behaviour.INVALID: adv.invalid_rate,
            Behaviour.DUPLICATE: adv.duplicate_rate,
            Behaviour.REPLAY: adv.replay_rate,
        }[Behaviour(beh)]
        self.loop.after(rng.expovariate(rate), self._misbehave, p)
        if not self.net.online[p]:
            return
        targets = sorted(self.net.conns[p])
        if beh == Behaviour.SPAM or beh == Behaviour.INVALID:
            msg = self.publish(p, valid=beh == Behaviour.SPAM)
            for q in targets:
                if q not in self.routers[p].mesh:
                    self._send_msg(p, q, msg, "spam")
        elif beh == Behaviour.DUPLICATE:
            self.publish(p, body_digest=hashlib.sha256(b"same-work" + self.ids[p]).digest())
        elif beh == Behaviour.REPLAY and self.old and targets:
            old = self.old[rng.randrange(len(self.old))]
            # a new gossip message of p's carrying another key's signed header
            copy = dataclasses.replace(old, publisher=p)
            self._send_msg(p, targets[rng.randrange(len(targets))], copy, "replay")

    # -- running --------------------------------------------------------------------

    def run(self, progress=None) -> dict:
        """Start, publish for `duration_s`, drain for `lifetime_s` (so every message
        published is judged), and return the summary figures. The cyclic garbage
        collector is paused meanwhile (`swarm_sim.core.gc_paused`)."""
        with gc_paused():
            self.start()
            self.loop.run(self.wl.duration_s + self.wl.lifetime_s, progress)
            return self.summary()

    def summary(self) -> dict:
        """The run's summary figures: the metrics' and the network's."""
        c = self.net.c
        self.m.duplicates_suppressed = c.copies_suppressed
        out = self.m.summary()
        out.update(
            {
                "peers": self.n,
                "virtual_s": self.wl.duration_s,
                "events": self.loop.events,
                "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received,
                "bytes_dropped": c.bytes_dropped,
                "bytes_in_flight": c.in_flight_bytes,
                "bytes_by_kind": dict(sorted(c.by_kind.items())),
                "lost": c.lost,
                "dropped_offline": c.dropped_offline,
                "refused_connections": c.refused_connections,
                "adversaries": sum(1 for b in self.behaviour if b),
                "stale_at_trainer": self.m.stale_at_trainer,
                "used_at_trainer": self.m.used_at_trainer,
                "gap_charges": self._gap_summary(),
            }
        )
        return out

    def _gap_summary(self) -> dict:
        """Who the trainer charged for withheld counters: every shopper should be, no
        honest producer (churn and lost messages must not look like shopping)."""
        shop = Behaviour.SHOP
        shoppers = [p for p in range(1, self.n) if self.publisher[p] and self.behaviour[p] == shop]
        return {
            "shoppers": len(shoppers),
            "shoppers_charged": sum(1 for p in shoppers if p in self.gap_charged),
            "honest_charged": sum(1 for p in self.gap_charged if self.behaviour[p] == HONEST),
            "others_charged": sum(
                1 for p in self.gap_charged if self.behaviour[p] not in (HONEST, shop)
            ),
        }
