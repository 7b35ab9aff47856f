"""New identities at a cold start: a view that started empty takes every honest signer of a
new swarm, and the allowance opens nothing for an attacker against a running view.

Attacker's side: a view restored from the store (a restart) is never young; headers a
sender authored for other keys never draw on the young allowance (they pay, as before);
one sender gets only a share of it; and it ends with its window.
"""

from __future__ import annotations

from protocol import admission as adm
from protocol.admission import Deliver, Kind, MessageReceived, Reason
from protocol.identity import Identity
from tests.test_protocol_trust import T0, header, machine, reject, rollout

RELAYS = [f"relay-{i}" for i in range(12)]


def _keys(n: int, base: int) -> list[Identity]:
    return [Identity.from_private_bytes((base + i).to_bytes(2, "big") * 16) for i in range(n)]


def _relayed(a, keys: list[Identity], t0: float, seed: int) -> list[list]:
    """Each key's first header, relayed by one of a dozen mesh peers, 300 in 30 s."""
    out = []
    for i, k in enumerate(keys):
        t = t0 + i * 0.1
        h = header(rollout(k, seq=1, seed=seed + i, at=t))
        out.append(
            a.handle(
                MessageReceived(RELAYS[i % 12], Kind.ROLLOUT_HEADER, h, t, origin=k.peer_id_b58)
            )
        )
    return out


def test_a_cold_start_view_admits_every_new_signer_of_a_new_swarm() -> None:
    a = machine()
    outcomes = _relayed(a, _keys(300, 9000), T0, 90_000)
    refused = [o[0].reason for o in outcomes if not isinstance(o[-1], Deliver)]
    assert refused == [], refused[:3]


def test_a_restored_view_is_not_young_and_still_limits_fresh_keys() -> None:
    known = _keys(5, 9500)
    a = machine()
    a.handle(adm.Known(Kind.ROLLOUT_HEADER, (), T0, signers=tuple(k.peer_id for k in known)))
    outcomes = _relayed(a, _keys(300, 9000), T0, 91_000)
    refused = [o for o in outcomes if not isinstance(o[-1], Deliver)]
    assert len(refused) > 150  # the running rates: 64 at once, 2 a second after
    assert all(
        reject(o).reason is Reason.NEW_IDENTITIES and reject(o).penalty == 0 for o in refused
    )


def test_a_sender_authoring_fresh_keys_gets_no_young_allowance_and_pays() -> None:
    a = machine()
    for i, k in enumerate(_keys(300, 9000)):
        h = header(rollout(k, seq=1, seed=92_000 + i, at=T0 + i * 0.1))
        a.handle(MessageReceived("author", Kind.ROLLOUT_HEADER, h, T0 + i * 0.1, origin="author"))
    assert a.scores.score("author", T0 + 30) < 0


def test_one_sender_gets_only_its_share_and_the_window_ends() -> None:
    a = machine(young_view_per_sender=50, young_view_s=60.0)
    keys = _keys(200, 9000)
    first = []
    for i, k in enumerate(keys[:100]):
        t = T0 + i * 0.01
        h = header(rollout(k, seq=1, seed=93_000 + i, at=t))
        first.append(
            a.handle(MessageReceived("relay-x", Kind.ROLLOUT_HEADER, h, t, origin=k.peer_id_b58))
        )
    admitted = sum(isinstance(o[-1], Deliver) for o in first)
    assert 50 <= admitted < 100  # its share, plus the running rates' burst
    # past the window, the running rates only: 64 at once for all senders
    later = _relayed(a, keys[100:], T0 + 120, 94_000)
    assert sum(isinstance(o[-1], Deliver) for o in later) < 100
