"""`protocol.hole_punch`: which hole-punch dials are made, and who pays for the rest."""

from __future__ import annotations

from protocol import hole_punch as hp


def test_a_punch_dials_at_most_its_budget_and_an_address_once_a_minute() -> None:
    b = hp.HolePunchBudget()
    allowed = [b.admit(1, "p", "198.51.100.7", port, 0.0, relayed=True) for port in range(1, 21)]
    assert allowed.count(None) == 8
    assert {r.reason for r in allowed if r is not None} == {hp.PUNCH_SPENT}
    assert not any(r.charge for r in allowed if r is not None)  # its own budget: free
    again = b.admit(2, "p", "198.51.100.7", 1, 30.0, relayed=True)
    assert again is not None and again.reason == hp.DIALLED_RECENTLY and not again.charge
    other = b.admit(3, "q", "198.51.100.7", 2, 30.0, relayed=True)
    assert other is not None and other.reason == hp.ANOTHER_PEERS and other.charge
    assert b.admit(4, "p", "198.51.100.7", 1, 61.0, relayed=True) is None  # a minute later


def test_an_ip_and_a_peer_have_budgets_per_minute() -> None:
    b = hp.HolePunchBudget()
    dials = [
        b.admit(punch, f"peer{punch}", "198.51.100.7", 1000 + 10 * punch + i, 0.0, relayed=True)
        for punch in range(5)
        for i in range(8)
    ]
    assert dials.count(None) == 16
    assert any(r is not None and r.reason == hp.IP_SPENT and r.charge for r in dials)
    b = hp.HolePunchBudget()
    own = [
        b.admit(punch, "p", f"198.51.{punch}.{i}", 4001, 0.0, relayed=True)
        for punch in range(10)
        for i in range(3)
    ]
    assert own.count(None) == 24
    assert any(r is not None and r.reason == hp.PEER_SPENT and r.charge for r in own)


def test_only_relayed_peers_and_addresses_a_host_can_have() -> None:
    b = hp.HolePunchBudget()
    assert b.admit(1, "p", "198.51.100.7", 1, 0.0, relayed=False).reason == hp.NOT_RELAYED  # type: ignore[union-attr]
    for ip in ("127.0.0.1", "0.0.0.0", "224.0.0.1", "169.254.1.1", "240.0.0.1", "::1", "nope"):
        r = b.admit(1, "p", ip, 1, 0.0, relayed=True)
        assert r is not None and r.reason == hp.NOT_DIALABLE, ip
    assert b.admit(1, "p", None, 0, 0.0, relayed=True).reason == hp.NOT_DIALABLE  # type: ignore[union-attr]
    mine = b.admit(1, "p", "10.9.9.9", 80, 0.0, relayed=True, own_ips=frozenset({"10.9.9.9"}))
    assert mine is not None and mine.reason == hp.OWN_ADDRESS
    three_ips = [b.admit(9, "p", f"198.51.100.{i}", 1, 0.0, relayed=True) for i in range(5)]
    assert three_ips.count(None) == 3
    loop = hp.HolePunchBudget(hp.HolePunchLimits(loopback=True))
    assert loop.admit(1, "p", "127.0.0.1", 4001, 0.0, relayed=True) is None
    assert hp.HolePunchBudget().offered(21) == hp.Refused(hp.TOO_MANY_OFFERED)
    assert hp.HolePunchBudget().offered(20) is None


def test_memory_is_bounded_and_refuses_rather_than_forgets() -> None:
    b = hp.HolePunchBudget(hp.HolePunchLimits(remembered=4, per_ip=100, per_peer=100))
    assert [b.admit(i, f"p{i}", f"198.51.100.{i}", 1, 0.0, relayed=True) for i in range(4)] == [
        None
    ] * 4
    full = b.admit(9, "p9", "198.51.100.9", 1, 1.0, relayed=True)
    assert full is not None and full.reason == hp.MEMORY_FULL and not full.charge
    assert b.admit(1, "p1", "198.51.100.1", 1, 30.0, relayed=True) is not None  # still held
    assert b.admit(9, "p9", "198.51.100.9", 1, 60.0, relayed=True) is None  # room again
