"""The stages that need no memory of their own: SIZE, DECODE (with SIGNATURE) and CONTEXT.

Each is a function of the message in flight (and, for CONTEXT, of the run's rules and our
views) that returns, or raises `Refused`.
"""

from __future__ import annotations

from typing import Any

from protocol.admission.config import AdmissionConfig, RunRules
from protocol.admission.inflight import InFlight, Refused, relaying, rollout_header, same_peer
from protocol.admission.kinds import Opened
from protocol.admission.messages import Admitted
from protocol.admission.version_view import VersionView
from protocol.admission.vocabulary import Reason, Stage
from protocol.assignment import task_seed
from protocol.audit_sample import check_ticket
from protocol.authority import Authority
from protocol.errors import DecodeError, IntegrityError, RemoteProtocolError, SignatureError
from protocol.peer_score import PeerId
from protocol.version_claims import VersionClaims

__all__ = ["check_context", "check_decode", "check_judge", "check_size"]


def check_size(m: InFlight) -> None:
    """SIZE: refuse bytes over the kind's limit (before anything reads them)."""
    if len(m.data) > m.rule.max_bytes:
        raise Refused(Stage.SIZE, Reason.OVERSIZED, f"{len(m.data)} bytes > {m.rule.max_bytes}")


def check_decode(m: InFlight) -> None:
    """DECODE and SIGNATURE in one call to the kind's opener (the protocol functions do
    both); which stage failed is read from the error's class. Fills `m.opened`."""
    if type(m.data) is not bytes:
        m.data = bytes(m.data)  # copied only once the size is known to be within limits
    try:
        m.opened = m.rule.opener(m.data)
    except SignatureError as exc:
        raise Refused(Stage.SIGNATURE, Reason.BAD_SIGNATURE, str(exc), exc.penalty) from None
    except IntegrityError as exc:
        raise Refused(Stage.SIGNATURE, Reason.BODY_MISMATCH, str(exc), exc.penalty) from None
    except DecodeError as exc:
        raise Refused(Stage.DECODE, Reason.MALFORMED, str(exc), exc.penalty) from None
    except RemoteProtocolError as exc:  # any other way a peer's bytes can be wrong
        raise Refused(Stage.DECODE, Reason.MALFORMED, str(exc), exc.penalty) from None


def check_context(
    m: InFlight,
    run: RunRules,
    view: VersionView,
    claims: VersionClaims,
    authority: Authority,
    config: AdmissionConfig,
) -> None:
    """CONTEXT: is the message meant for this run, at our version, from a key allowed to
    sign it, at a believable time? Checks in this order: run, task seed binding, staleness,
    unpublished and future versions, weights' signer and newness, the judge, the
    delegation's signer, clock skew."""
    assert m.opened is not None
    rule, op, now = m.rule, m.opened, m.now
    env = op.envelope
    who = env.signer
    obj: Any = op.obj  # the kind's decoded object

    def refuse(reason: Reason, detail: str) -> Refused:
        return Refused(Stage.CONTEXT, reason, detail, signer=who)

    if env.run_id != run.run_id:
        raise refuse(Reason.WRONG_RUN, f"run {env.run_id!r}, this is {run.run_id!r}")
    if rule.work and run.run_seed is not None:
        header = rollout_header(op)
        if header.task_seed != task_seed(run.run_seed, header.counter, who):
            r = refuse(Reason.NOT_BOUND, "task seed not derived from the signer's key and counter")
            r.blame_signer = True  # it signed a claim to work its key did not make
            raise r
        if op.body is not None and obj.body.sampling_seed != header.task_seed:
            # The body is another producer's (its seed is bound to that key): a header
            # naming someone else's body digest, served as its own.
            r = refuse(Reason.NOT_BOUND, "body not sampled with the signer's task seed")
            r.blame_signer = True
            raise r
    if rule.versioned:
        v, t, s = env.policy_version, view.version, run.max_staleness
        if t - v > s:
            # Who pays: nobody for bytes we asked for (a pull) or for a rollout that
            # went stale while it was made or on its way; its signer otherwise.
            fault = rule.gossip and view.stale_by_fault(
                v, env.timestamp_ms, run.max_staleness, config.stale_grace_s
            )
            r = Refused(
                Stage.CONTEXT,
                Reason.STALE,
                f"version {v} at {t}: {t - v} > S={s}",
                None if fault else 0.0,
                signer=who,
            )
            if rule.work:
                r.late = Admitted(m.kind, op.content_id, m.peer, env, obj, b"", now)
            raise r
        if v > t and rule.work and config.publishes_versions:
            r = refuse(Reason.UNPUBLISHED_VERSION, f"version {v}, the newest published is {t}")
            r.blame_signer = True  # it signed a claim of weights that do not exist
            raise r
        if v - t > (margin := config.max_future_versions):
            # The signer holds v's manifest; a relay one of v - margin or newer.
            at_least = v if same_peer(m.peer, who) else v - margin
            ask = claims.claimed(m.peer, at_least, now) if rule.gossip else None
            r = refuse(Reason.FUTURE_VERSION, f"version {v}, ours is {t}")
            r.ask = ask
            raise r
    if rule.weights:
        if who not in run.trainer_keys:
            raise refuse(Reason.UNAUTHORIZED, "weights not signed by a trainer key")
        version = obj.version
        if rule.gossip and not view.weights_are_new(version):
            raise refuse(Reason.OUTDATED, f"weights version {version} is not new")
    if rule.judged:
        check_judge(op, run, authority, m.peer, m.origin)
    if rule.delegation and not authority.may_delegate(who):
        raise refuse(Reason.UNAUTHORIZED, "delegation not signed by a trainer key")
    if rule.gossip:
        skew_ms = env.timestamp_ms - now * 1000.0
        if abs(skew_ms) > config.max_skew_s * 1000.0:
            raise refuse(Reason.CLOCK_SKEW, f"timestamp {skew_ms:+.0f} ms from now")


def check_judge(
    op: Opened,
    run: RunRules,
    authority: Authority,
    sender: PeerId,
    origin: PeerId | None = None,
) -> None:
    """A verdict (or a producer claim) counts only from a key allowed to judge, never
    about its own work, and its sample ticket (if any) must be the signer's."""
    who, v = op.envelope.signer, op.obj
    # Whether a key may judge can change (delegations): a relay that has not heard
    # of a revocation yet is not to blame.
    pen = 0.0 if relaying(sender, origin, who) else None
    if not authority.may_judge(who):
        raise Refused(
            Stage.CONTEXT,
            Reason.UNAUTHORIZED,
            "signer may not judge",
            pen,
            wasteful=not authority.ever_named(who),
        )
    if v.producer == who:
        raise Refused(Stage.CONTEXT, Reason.UNAUTHORIZED, "a verdict on its own work", pen)
    if getattr(v, "sample_ticket", b"") and not check_ticket(
        who, run.run_id, v.rollout_id, v.sample_ticket
    ):
        raise Refused(Stage.SIGNATURE, Reason.BAD_SIGNATURE, "sample ticket is not the signer's")
