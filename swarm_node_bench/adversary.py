"""`swarm-node bench adversary`: the network's rules against attackers.

Real processes on loopback (`swarm_node_bench.parts.adv_peer`: the full peer, py-libp2p, SQLite): one
trainer, one validator (the run manifest's only validator key), two honest workers
producing signed synthetic records, and one attacker process that runs each attack from
`swarm_node_bench.parts.attacks` with a fresh identity and peer, one after the other, while the
honest workers keep producing. The records are synthetic (not model output) and the
validator's audit re-scores a stand-in reward fixed by each body (`true_reward`): this
measures the trust rules (admission, authority, sampling, accounting, scoring), not the
model audit, which `bench verify` measures.

Per attack (`attacks[name]`):
    rejected_fraction      share of the attack's messages that had no effect at the trainer:
                           refused by admission, or admitted but never counted (not
                           verified work, a vote that counts for nothing, no unit of work
                           counted twice); `measure` says which effect was looked for. For
                           `changed_model` only the changed model's records count (its
                           honest probation records before them are no attack)
    attacker_penalized     an honest peer (trainer, validator, worker) scored the attacking
                           peer below zero or banned it, or every key that signed the
                           attack's messages was banned in standing by the trainer or the
                           validator (`signers_cut_off` 1.0) or scored below zero or banned
                           by an honest peer (an attacker relaying for many keys pays
                           through them)
    honest_banned          an honest peer banned a worker, the validator or the trainer
    honest_throughput_ratio  honest rollouts verified at the trainer per rollout the
                           validator sampled, made during the attack, divided by the same
                           during a window of the same run without an attacker
    honest_trained_fraction  honest rollouts made during the attack that the trainer trained
                           on (`node.roles.trainer.pick_ready`: its own pass verdict, or a producer
                           in good standing and the hold waited) per honest rollout made then
    signers_cut_off        share of the attack's signers that the trainer or the validator
                           banned in its standing (`protocol.standing`)
plus `shopping_reward_gain` (the reward the trainer's work ledger credits the counter
shopper per produced counter, withheld ones counting 0 and a refused producer 0, divided by
the honest workers' mean), `rss_mb_max` (peak RSS of any process),
`honest_trained_fraction` (as above, in a window without an attacker, at least 10 s, one
validator at the default `audit_fraction`) and `cheater_records_trained` (records of
`changed_model`'s changed model trained on before it was cut off; it passes its probation
honestly, then a quarter of its records fail their audit).

Cases of the window rule and standing (`swarm_node_bench.parts.attacks`): `window_withheld_body`,
`window_many_keys` and `window_minority_changed` (a slightly changed model hiding from
the window rule: a body withheld per window, six keys of half a window each, four changed
records a window), and `changed_model` (above). The trainer's hold is `--hold` (quick 5 s,
full `protocol.standing.HOLD_S`) and the validator closes windows after `--close` s
(quick 5, full `verify.producer.CLOSE_AFTER_S`).
    credit_gain            (the credit cases below and `counter_shopping`) the
                           attacker's credited mean reward at the trainer (`protocol.credit`:
                           re-scored held bodies, failed, skipped and withheld counters at 0)
                           divided by the mean true reward of the counters it made that the
                           trainer accounts for (its first to its last counter heard)
Per attack also `honest_penalty` (the score the honest peers and the case's victims lost
at honest peers, from the case's start until the next case's: 0.0 means no honest key
paid) and, for the second credit round's cases (`swarm_node_bench.parts.attacks`:
`minority_change_per_window`, `partial_window_keys`, `bound_digest_theft`,
`key_shopping`, `delayed_restart_batch`), `credit_gain`: the attacker's keys' credited
mean reward per counter the trainer accounts for, weighted by standing as paid, divided
by the true worth per counter of everything they made (a changed model's record, another
producer's body and a counter never published included; None when that is 0, with
`credited` in the raw report); `victim_held_fraction` (theft, restart: the share of the
victim's counters whose bodies the trainer credited). Measures: `theft` counts stolen
bodies credited to the thief; `gain` has no message to refuse (rejected unless
`credit_gain` > 1.02). The trainer's free go-back window is `adv_peer.BACK_WINDOW_S`
(40 s) so that two restarts `attacks.RESTART_GAP_S` apart (signed) fit in a run. In
`--quick`, a case's `honest_trained_fraction` is None when the trainer held fewer than
90% of the bodies of the honest records made in its window by the report: too short to
judge.
`claimed_reward_lie`: every header claims reward 1, only solved bodies are served;
rejected counts reward credited beyond the attacker's true rewards, per lie.
`version_shopping`: per counter the task sampled under V, V+1, V+2 (the trainer published
V) and whichever solved published; rejected counts shopped rollouts (V+1, V+2) the trainer
admitted. `published_version_shopping`: the same over V, V-1, V-2 (all published, within
S; the true reward is V's); rejected as for `claimed_reward_lie`, per shopped counter.
`stay_low_version_shopping`: holds V-2, V-1, V and never goes back: per counter it
publishes the lowest version, from its current one up, that solved (the true reward is
V's); rejected as for `claimed_reward_lie`, per counter below V. The trainer published V a
`protocol.credit.STALE_AFTER_S` before the run, so claims of older versions are stale.
plus `shopping_reward_gain` (the reward the trainer's work ledger credits the counter
shopper per produced counter, withheld ones counting 0 and a refused producer 0, divided by
the honest workers' mean), `honest_credit_ratio` (the honest workers' earned mean reward,
before the probation cap of `protocol.standing.credit_weight`,
over the mean reward their headers claim, which is their true one: 1.0 means credit costs
honest work nothing) and `rss_mb_max` (peak RSS of any process).

Connection cases, in the sibling dict `connection_attacks[name]`, run after
the attacks above by this driver process from plain py-libp2p hosts (`node.testing.conn_attacks`)
against the trainer process, each followed by a fresh honest peer. Per case:
    honest_connect_after   a fresh honest peer (the node's own host, new key) connects to the
                           trainer, pings it (`/ipfs/ping/1.0.0`) and sees it in the GossipSub
                           peers of the rollouts topic, within 10 s
    rejected_fraction      share of the attack's connections or messages without effect (below)
    attacker_penalized     what counts, per case (below)
    honest_banned          the trainer, validator or a worker banned any of those four
    rss_mb_growth          the trainer's RSS (VmRSS) after the case minus before, MB
`relay_copy_quota` adds `signer_penalty` (the honest signer's score change over its own
copies, capped at 0: 0.0 means it paid nothing). `connection_details[name]` has the raw
counts, the trainer's connections and refusals (ledger lines by reason) before and after,
the attackers' scores, and the honest probe. `connection_targets_met` is true when every
case meets the issue's targets (honest_connect_after, attacker_penalized (except
relay_copy_quota: signer_penalty 0.0 instead), not honest_banned, rss_mb_growth <= 50).

    connection_churn       `--churn` connections (quick 200, full 1,000), each from a fresh
                           identity, opened and closed at once, in 8 lanes of sequential
                           connections (at most 8 open at a time: py-libp2p's dialer sleeps
                           ~0.45 s per connection). rejected: the connections the trainer no
                           longer holds afterwards (closed and released), so ~1.0 means no
                           leak. penalized (no identity to charge, and no excess at any
                           moment): the trainer released every one (it holds at most 2 more
                           connections after than before).
    connection_flood       `--flood` connections at once (quick 100, full 300) from fresh
                           identities, held 3 s. The trainer's `max_connections` is
                           `--trainer-cap` (quick 60, full the default 200) so the flood
                           exceeds it. rejected: refused at connect or closed by the
                           trainer while held. penalized: the trainer closed or refused the
                           excess (the flood's connections still open after the hold plus
                           the trainer's others at most its cap + 2).
    relay_copy_quota       a relay (fresh identity) forwards 140 of an honest worker W's
                           headers as W published them (origin W, signed by W) then copies of
                           W's next 10 while W is over its signer quota at the trainer;
                           3 s later W's own copies of those 10 arrive on W's connection.
                           rejected: the relay's messages the trainer did not admit.
                           penalized: the relay scored below 0 or banned (false by design:
                           forwarding honest headers is not punishable).
    gossip_control_abuse   one fresh identity on one GossipSub stream: `--topics` junk
                           subscriptions (quick 10,000, full 100,000), `--graft-prune`
                           GRAFT/PRUNE (2,000 / 12,000), `--ihave` IHAVEs of 5,000 ids (50 /
                           300), interleaved. rejected: what the control budgets
                           (`node.host.gossip_guard.ControlLimits` defaults) drop at least, plus
                           writes that failed. penalized: scored below 0 or banned at the
                           trainer (`too_many_topics`, `graft_prune_flood`, `ihave_flood`).
    oversize_library_drop  `--oversize` 1.5 MB gossip RPCs (quick 3, full 10), each on a new
                           GossipSub stream from one fresh identity. rejected: every one
                           (over the library's 1 MiB limit). penalized: scored below 0 or
                           banned at the trainer (`oversize_rpc`).

The run's authorities (`swarm_node_bench.parts.authority`), in both modes:
`equivocation` (real peers in the driver process: a hub and two peers on each side of a
split; a trainer key signs two manifests of version 2, each side installs its own:
`detected` every peer treats the key as failed, `evidence_gossiped` peers that gossiped
evidence they found, `time_to_detect_s` the slowest peer's time from both announcements
out, `honest_charged` honest pairs scored below 0) and `validators` (virtual time, the
trainer's rules: two honest validators and one that fails an honest worker and passes
everything else at once; `honest_credit_kept` the worker's credit with the liar over
without, `bad_validators_flagged`, `honest_validators_flagged`, `cheater_changed_trained`).

`--attacks` may name `equivocation` and `validators` too: only the sections named run
(both when it names none of them and no case either; neither when it names cases only).

`--quick`: 2.5 s per attack window and the connection cases' quick counts (about three
minutes on 2 shared cores, the connection cases ~45 s of it). Full: 10 s windows and the issue's counts. Options after the name:
`--window S`, `--rate R` (honest records per second per worker), `--attacks A,B` (only
these cases), `--settle S`, `--audit-fraction F` (the validator's, 0.5; credit counts every held
body's re-score, so it carries no sampling noise at any fraction), and the connection
cases' counts above.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from node.console import sayer
from node.peer.gossip import topic_name
from node.testing.adversary_records import manifest
from node.testing.conn_attacks import CONN_ATTACKS, conn_attack, honest_probe
from node.testing.peer_process import PeerProcess
from protocol.identity import Identity
from protocol.standing import HOLD_S
from swarm_node_bench.parts.attacks import ATTACKS
from verify.producer import CLOSE_AFTER_S

MODULE = "swarm_node_bench.parts.adv_peer"


_say = sayer("bench adversary")


def _in(window: tuple[float, float], t: float) -> bool:
    return window[0] <= t < window[1]


def _throughput(
    window: tuple[float, float], verified: set[str], sampled: list[list[Any]], honest: set[str]
) -> float | None:
    picked = [rid for rid, t, producer in sampled if producer in honest and _in(window, t)]
    if not picked:
        return None
    return sum(rid in verified for rid in picked) / len(picked)


async def _run(
    window_s: float, rate: float, settle_s: float, opts: argparse.Namespace
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-adversary-"))
    keys = {name: Identity.generate() for name in ("trainer", "validator", "w1", "w2")}
    validator = keys["validator"].peer_id_b58
    procs: dict[str, PeerProcess] = {}

    async def spawn(name: str, role: str, boot: list[str]) -> PeerProcess:
        key = ["--key", keys[name].private_bytes().hex()] if name in keys else []
        cap = ["--max-connections", str(opts.trainer_cap)] if name == "trainer" else []
        cap += ["--hold", str(opts.hold)] if name == "trainer" else []
        cap += ["--close", str(opts.close)] if name == "validator" else []
        return await PeerProcess.start(
            "--data-dir",
            str(root / name),
            "--role",
            role,
            "--validator",
            validator,
            "--audit-fraction",
            str(opts.audit_fraction),
            *key,
            *cap,
            *(["--bootstrap", *boot] if boot else []),
            module=MODULE,
            timeout=90.0,
            stderr_path=str(root / f"{name}.log"),
        )

    try:
        procs["trainer"] = await spawn("trainer", "trainer", [])
        boot = [procs["trainer"].addrs[0]]
        async with trio.open_nursery() as n:
            for name, role in (
                ("validator", "validator"),
                ("w1", "inference"),
                ("w2", "inference"),
                ("attacker", "relay"),
            ):

                async def one(name: str = name, role: str = role) -> None:
                    procs[name] = await spawn(name, role, boot if name != "attacker" else [])

                n.start_soon(one)
        _say(f"5 processes up in {root}")
        await trio.sleep(3.0)  # meshes form
        for w in ("w1", "w2"):
            await procs[w].ask({"cmd": "produce", "rate": rate})
        await trio.sleep(2.0)
        record_cases = [a for a in ATTACKS if a in opts.attacks]
        t0 = time.time()
        await trio.sleep(max(window_s, 10.0) if record_cases else window_s)
        baseline = (t0, time.time())
        runs: dict[str, dict[str, Any]] = {}
        targets = [procs[n].addrs[0] for n in ("trainer", "validator", "w1", "w2")]
        for name in record_cases:
            start = time.time()
            answer = await procs["attacker"].ask(
                {
                    "cmd": "attack",
                    "name": name,
                    "seconds": window_s,
                    "targets": targets,
                    "validator": validator,
                },
                timeout=window_s + 90,
            )
            runs[name] = {**answer, "window": (start, time.time())}
            _say(f"{name}: sent {answer.get('sent')}")
        starts = [r["window"][0] for r in runs.values()]
        ends = [*starts[1:], math.inf] if starts else []  # each case until the next begins
        for r, until in zip(runs.values(), ends, strict=True):
            r["until"] = until  # its charges: until the next case starts
        conn: dict[str, Any] = {}
        for name in [a for a in CONN_ATTACKS if a in opts.attacks]:
            conn[name] = await _conn_case(name, procs, keys, validator, opts)
            _say(f"{name}: {conn[name]}")
        for w in ("w1", "w2"):
            await procs[w].ask({"cmd": "stop"})
        await trio.sleep(
            max(settle_s, opts.hold + 5.0) if record_cases else settle_s
        )  # verdicts, holds
        honest = {k.peer_id_b58 for k in keys.values()}
        ids = sorted(
            honest
            | {
                p
                for r in runs.values()
                for p in [r.get("attacker", ""), *r["signers"], *r.get("victims", [])]
                if p
            }
        )
        t_rep = await procs["trainer"].ask({"cmd": "report", "ids": ids}, timeout=60)
        v_rep = await procs["validator"].ask({"cmd": "report", "ids": ids}, timeout=60)
        others = [
            await procs[w].ask({"cmd": "report", "ids": ids}, timeout=60)
            for w in ("w1", "w2", "attacker")
        ]
        rss = [t_rep["rss_mb"], v_rep["rss_mb"], *(o["rss_mb"] for o in others)]
        views = [t_rep, v_rep, *others[:2]]  # the honest peers' views of everyone
        (root / "reports.json").write_text(json.dumps({"runs": runs, "views": views, "conn": conn}))
        _say(f"raw reports in {root / 'reports.json'}")
    finally:
        with trio.move_on_after(30) as cleanup:
            cleanup.shield = True
            for p in procs.values():
                await p.stop()
    out = figures(runs, t_rep, v_rep, views, keys, baseline, max(rss), quick=opts.quick)
    if conn:
        out["connection_attacks"] = {k: v["figures"] for k, v in conn.items()}
        out["connection_details"] = {k: v["details"] for k, v in conn.items()}
        out["connection_targets_met"] = all(
            f["honest_connect_after"]
            and f["attacker_penalized"]
            and not f["honest_banned"]
            and f["rss_mb_growth"] <= 50.0
            for k, f in out["connection_attacks"].items()
            if k != "relay_copy_quota"
        ) and all(
            f["signer_penalty"] == 0.0 and f["honest_connect_after"] and not f["honest_banned"]
            for k, f in out["connection_attacks"].items()
            if k == "relay_copy_quota"
        )
    return out


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Refusals (ledger lines by reason) the target wrote between two looks."""
    return {r: n - before.get(r, 0) for r, n in sorted(after.items()) if n > before.get(r, 0)}


async def _conn_case(
    name: str,
    procs: dict[str, PeerProcess],
    keys: dict[str, Identity],
    validator: str,
    opts: argparse.Namespace,
) -> dict[str, Any]:
    """One connection case against the trainer: before/after looks at it, the attack,
    then a fresh honest peer, then every honest peer's view of the honest ones."""
    trainer = procs["trainer"]
    m = manifest("adversary", validator)

    async def probe(ids: list[str]) -> dict[str, Any]:
        return await trainer.ask({"cmd": "probe", "ids": ids}, timeout=30)

    before = await probe([])
    cmd = {
        "name": name,
        "target": trainer.addrs[0],
        "count": opts.churn,
        "topics": opts.topics,
        "graft_prune": opts.graft_prune,
        "ihave": opts.ihave,
        "oversize": opts.oversize,
    }
    if name == "connection_flood":
        cmd["count"] = opts.flood
    start = time.monotonic()
    ans = await conn_attack(cmd, m, probe)
    took = time.monotonic() - start
    await trio.sleep(2.0)  # closes and charges land
    after = await probe(ans["ids"])
    hp = await honest_probe(trainer.addrs[0], topic_name(m.run_id, "rollouts"))
    honest = [k.peer_id_b58 for k in keys.values()]
    views = [
        await procs[n].ask({"cmd": "probe", "ids": honest}, timeout=30)
        for n in ("trainer", "validator", "w1", "w2")
    ]
    sent = max(1, int(ans["sent"]))
    if name == "connection_churn":
        held = max(0, after["connections"] - before["connections"])
        rejected = sent - min(sent, held)
        penalized = held <= 2  # every churned connection released (none to charge)
    elif name == "connection_flood":
        rejected = int(ans["rejected"])
        penalized = ans["kept"] + before["connections"] <= opts.trainer_cap + 2
    else:
        rejected = int(ans["rejected"])
        penalized = any(
            after["scores"].get(p, 0.0) < 0 or after["banned"].get(p) for p in ans["ids"]
        )
    figures: dict[str, Any] = {
        "honest_connect_after": bool(hp["ok"]),
        "rejected_fraction": round(max(0.0, min(1.0, rejected / sent)), 4),
        "attacker_penalized": bool(penalized),
        "honest_banned": any(v["banned"].get(h) for v in views for h in honest),
        "rss_mb_growth": round(after["rss_mb_now"] - before["rss_mb_now"], 1),
        "sent": int(ans["sent"]),
    }
    details = {k: v for k, v in ans.items() if k not in ("ids", "signer")}
    details.update(
        target_connections_before=before["connections"],
        target_connections_after=after["connections"],
        attack_s=round(took, 1),
        attacker_scores={p[:16]: round(after["scores"].get(p, 0.0), 3) for p in ans["ids"]},
        attacker_banned=any(after["banned"].get(p) for p in ans["ids"]),
        honest_probe=hp,
        target_refusals=_delta(before["refused"], after["refused"]),
    )
    if name == "relay_copy_quota":
        figures["signer_penalty"] = round(
            min(0.0, ans["signer_score_after_own"] - ans["signer_score_before_own"]), 3
        )
    return {"figures": figures, "details": details}


def _trained_fraction(
    window: tuple[float, float], t_rep: dict[str, Any], workers: set[str]
) -> float | None:
    """Honest rollouts made in `window` that the trainer trained on, per one made."""
    trained = {rid for p in workers for rid in t_rep["trained"].get(p, [])}
    made = [
        rid
        for rid, (producer, t) in t_rep["made"].items()
        if producer in workers and _in(window, t)
    ]
    return round(sum(rid in trained for rid in made) / len(made), 4) if made else None


def figures(
    runs: dict[str, dict[str, Any]],
    t_rep: dict[str, Any],
    v_rep: dict[str, Any],
    views: list[dict[str, Any]],
    keys: dict[str, Identity],
    baseline: tuple[float, float],
    rss: float,
    *,
    quick: bool = False,
) -> dict[str, Any]:
    """The benchmark's figures from the runs' reports: per attack what it cost the honest
    workers and the attacker (`quick`: an honest fraction too short to judge is None)."""
    workers = {keys["w1"].peer_id_b58, keys["w2"].peer_id_b58}
    cut_off = set(t_rep["banned_producers"]) | set(v_rep.get("standing_banned", []))
    honest_all = {k.peer_id_b58 for k in keys.values()}
    verified = {rid for p in workers for rid, _t in t_rep["verified"].get(p, [])}
    base = _throughput(baseline, verified, v_rep["sampled"], workers) or 1.0
    attacks: dict[str, Any] = {}
    for name, r in runs.items():
        signers = [s for s in r["signers"] if s]
        measure, sent = r["measure"], max(1, int(r["sent"]))
        if measure == "admitted":
            effect = sum(t_rep["admitted_by_signer"].get(s, 0) for s in signers)
        elif measure == "verified":
            effect = sum(len(t_rep["verified"].get(s, [])) for s in signers)
        elif measure == "trained" and "changed_ids" in r:  # the changed model's records only
            trained = {rid for s in signers for rid in t_rep["trained"].get(s, [])}
            effect = sum(rid in trained for rid in r["changed_ids"])
            sent = max(1, len(r["changed_ids"]))
        elif measure == "trained":
            effect = sum(len(t_rep["trained"].get(s, [])) for s in signers)
        elif measure == "usable":
            effect = sum(t_rep["usable"].get(s, 0) for s in signers)
        elif measure == "credit":  # reward credited beyond its true rewards
            effect = sum(
                max(0.0, (t_rep["credit"].get(s) or {}).get("reward_sum", 0.0) - r["true_sum"])
                for s in signers
            )
            sent = max(1, int(r["lies"]))
        elif measure == "ahead":  # rollouts of unpublished versions admitted by the trainer
            effect = sum(t_rep["admitted_ahead"].get(s, 0) for s in signers)
            sent = max(1, int(r["shopped"]))
        elif measure == "theft":  # stolen bodies credited to the thief
            held = (t_rep["credit"].get(r.get("attacker", "")) or {}).get("held", 0)
            own = len(r["truth_by_signer"].get(signers[0], {})) - int(r["stolen"])
            effect = max(0, held - own)
            sent = max(1, int(r["stolen"]))
        elif measure == "gain":  # no message to refuse: what it earned is the measure
            effect = sent if "truth_by_signer" in r and (_gain(r, t_rep) or 0.0) > 1.02 else 0
        else:  # "double": a unit of work counted twice anywhere
            effect = t_rep["double_counted"]
        attacker = r.get("attacker", "")
        banned = any(v["banned"].get(h) for v in views for h in honest_all)
        penalized = (
            _penalized(attacker, views)
            or bool(signers)
            and all(s in cut_off or _penalized(s, views) for s in signers)
        )
        ratio = _throughput(r["window"], verified, v_rep["sampled"], workers)
        attacks[name] = {
            "rejected_fraction": round(max(0.0, 1.0 - min(effect, sent) / sent), 4),
            "attacker_penalized": bool(penalized),
            "honest_banned": bool(banned),
            "honest_throughput_ratio": round(ratio / base, 3) if ratio is not None else None,
            "honest_trained_fraction": _trained_fraction(r["window"], t_rep, workers),
            "signers_cut_off": round(sum(s in cut_off for s in signers) / len(signers), 3)
            if signers
            else None,
            "sent": int(r["sent"]),
            "measure": measure,
        }
        if "true_sum" in r:
            attacks[name]["credit_gain"] = _credit_gain(r, t_rep["credit"].get(attacker) or {})
            attacks[name]["true_solved"] = int(r["true_sum"])
        if "truth_by_signer" in r:
            attacks[name]["credit_gain"] = _gain(r, t_rep)
        attacks[name]["honest_penalty"] = _honest_penalty(r, views, honest_all)
        if r.get("victims"):
            attacks[name]["victim_held_fraction"] = _victim_held(r, t_rep)
        if quick and not _judgeable(r["window"], t_rep, workers):
            attacks[name]["honest_trained_fraction"] = None  # too short to judge
        if "lies" in r:
            attacks[name]["lies"] = int(r["lies"])  # headers that lie, or counters shopped
    shopper = runs.get("counter_shopping", {}).get("attacker", "")
    rewards = [t_rep["counted_reward"].get(w) for w in workers]
    honest_reward = (
        statistics.mean(x for x in rewards if x is not None)
        if any(x is not None for x in rewards)
        else None
    )
    shop = t_rep["counted_reward"].get(shopper)
    gain = None
    if honest_reward:
        gain = round((shop or 0.0) / honest_reward, 3)
    cheater = runs.get("changed_model")
    cheated = None
    if cheater is not None:
        trained = {rid for s in cheater["signers"] for rid in t_rep["trained"].get(s, [])}
        cheated = sum(rid in trained for rid in cheater.get("changed_ids", []))
    ratios = [
        c / r
        for w in workers
        if (c := (t_rep["credit"].get(w) or {}).get("earned")) is not None
        and (r := t_rep["counted_reward"].get(w))
    ]
    honest_credit = round(statistics.mean(ratios), 3) if ratios else None
    return {
        "attacks": attacks,
        "shopping_reward_gain": gain,
        "honest_credit_ratio": honest_credit,
        "rss_mb_max": round(rss, 1),
        "honest_trained_fraction": _trained_fraction(baseline, t_rep, workers),
        "cheater_records_trained": cheated,
    }


def _gain(r: dict[str, Any], t_rep: dict[str, Any]) -> float | None:
    """The attacker's credited mean reward per counter the trainer accounts for (weighted
    by standing, as paid), over all its keys, divided by the true mean worth of every
    counter it made (a changed model's record or another's body worth 0); None when its
    work was worth nothing (then `credited` says what it got)."""
    truth = r["truth_by_signer"]
    victims = set(r.get("victims", []))
    made = [v for s, t in truth.items() if s not in victims for v in t.values()]
    paid = accounted = 0.0
    for s in truth:
        if s in victims:
            continue
        c = t_rep["credit"].get(s) or {}
        n = sum(c.get(k, 0) for k in ("held", "skipped", "out_of_order", "stale", "withheld"))
        paid += (c.get("credited") or 0.0) * n
        accounted += n
    true_mean = sum(made) / len(made) if made else 0.0
    r["credited"] = paid / accounted if accounted else 0.0
    if not true_mean:
        return None if r["credited"] else 0.0
    return round(r["credited"] / true_mean, 3)


def _honest_penalty(r: dict[str, Any], views: list[dict[str, Any]], honest: set[str]) -> float:
    """The score the honest peers (and the case's victims) lost at honest peers from the
    case's start until the next case's: 0.0 when nobody honest paid."""
    start, until = r["window"][0], r.get("until", math.inf)
    keys = honest | set(r.get("victims", []))
    lost = sum(
        d
        for v in views
        for p, charges in (v.get("charges") or {}).items()
        if p in keys
        for t, d in charges
        if start <= t < until
    )
    return round(lost, 3)


def _victim_held(r: dict[str, Any], t_rep: dict[str, Any]) -> float | None:
    """The share of the victims' counters whose bodies the trainer credited (held)."""
    made = sum(len(r["truth_by_signer"].get(v, {})) for v in r["victims"])
    held = sum((t_rep["credit"].get(v) or {}).get("held", 0) for v in r["victims"])
    return round(held / made, 4) if made else None


def _judgeable(window: tuple[float, float], t_rep: dict[str, Any], workers: set[str]) -> bool:
    """Whether the honest records made in `window` can be judged: the trainer held the
    bodies of at least 90% of them by the report (a quick run may end before it pulled
    them; trained-or-not then says nothing)."""
    held = set(t_rep.get("bodies", []))
    made = [
        rid
        for rid, (producer, t) in t_rep["made"].items()
        if producer in workers and _in(window, t)
    ]
    return bool(made) and sum(rid in held for rid in made) >= 0.9 * len(made)


def _penalized(peer: str, views: list[dict[str, Any]]) -> bool:
    """Whether an honest peer scored `peer` below zero or banned it."""
    return any(v["scores"].get(peer, 0.0) < 0 or v["banned"].get(peer) for v in views)


def _credit_gain(r: dict[str, Any], credit: dict[str, Any]) -> float | None:
    """The attacker's credited mean reward at the trainer over its true mean reward, over
    the counters the trainer accounts for (from the first it heard to the last: one it
    never heard of, before or after, is in no account)."""
    truth = {int(k): v for k, v in (r.get("truth") or {}).items()}
    first, last = credit.get("first"), credit.get("last")
    if truth and first is not None:
        assert last is not None  # the credit figures name both ends or neither
        seen = [v for k, v in truth.items() if first <= k <= last]
        true_mean = sum(seen) / len(seen) if seen else 0.0
    else:
        true_mean = r["true_sum"] / max(1, r["produced"])
    if not true_mean:
        return None
    return round((credit.get("credited") or 0.0) / true_mean, 3)


AUTHORITY_SECTIONS = ("equivocation", "validators")  # `--attacks` may name them too


def run(quick: bool, args: list[str]) -> dict[str, Any]:
    """Run the benchmark (arguments as in the module docstring); returns its figures."""
    parser = argparse.ArgumentParser(prog="swarm-node bench adversary")
    parser.add_argument("--window", type=float, default=2.5 if quick else 10.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument(
        "--audit-fraction",
        type=float,
        default=0.5,
        help="the validator's audited share (credit is estimated from it)",
    )
    parser.add_argument("--settle", type=float, default=12.0 if quick else 20.0)
    parser.add_argument(
        "--hold",
        type=float,
        default=5.0 if quick else HOLD_S,
        help="the trainer's hold of a good producer's unaudited rollouts, s",
    )
    parser.add_argument(
        "--close",
        type=float,
        default=5.0 if quick else CLOSE_AFTER_S,
        help="the validator's window close, s",
    )
    parser.add_argument(
        "--attacks",
        default="",
        help="comma-separated case names (default: all, the connection cases last)",
    )
    parser.add_argument("--churn", type=int, default=200 if quick else 1000)
    parser.add_argument("--flood", type=int, default=100 if quick else 300)
    parser.add_argument(
        "--trainer-cap",
        type=int,
        default=60 if quick else 200,
        help="the trainer's max_connections (quick: below the flood)",
    )
    parser.add_argument("--topics", type=int, default=10_000 if quick else 100_000)
    parser.add_argument("--graft-prune", type=int, default=2_000 if quick else 12_000)
    parser.add_argument(
        "--ihave", type=int, default=50 if quick else 300, help="IHAVE messages of 5,000 ids each"
    )
    parser.add_argument(
        "--oversize",
        type=int,
        default=3 if quick else 10,
        help="1.5 MB gossip RPCs, each on its own stream",
    )
    opts = parser.parse_args(args)
    opts.quick = quick
    names = [a for a in opts.attacks.split(",") if a]
    unknown = set(names) - set(ATTACKS) - set(CONN_ATTACKS) - set(AUTHORITY_SECTIONS)
    if unknown:
        parser.error(f"unknown attack(s): {sorted(unknown)}")
    wanted: set[str] = set(names) & set(AUTHORITY_SECTIONS) if names else set(AUTHORITY_SECTIONS)
    opts.attacks = (set(names) - set(AUTHORITY_SECTIONS)) or (
        set() if names else set(ATTACKS) | set(CONN_ATTACKS)
    )
    figures = trio.run(_run, opts.window, opts.rate, opts.settle, opts) if opts.attacks else {}
    from swarm_node_bench.parts.authority import sections  # deferred: heavy import

    figures.update(sections(wanted))  # the run's authorities
    return figures
