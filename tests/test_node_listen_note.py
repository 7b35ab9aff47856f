"""A node joining peers on other machines while it listens on loopback only is told why
they cannot dial it, by `start` and by `doctor` (`node.commands.addrs.loopback_note`)."""

from __future__ import annotations

from node.commands.addrs import loopback_note

PEER = "/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"


def test_loopback_listen_with_a_remote_peer_is_explained() -> None:
    note = loopback_note(["/ip4/127.0.0.1/tcp/0"], [f"/ip4/203.0.113.7/tcp/4001{PEER}"])
    assert note is not None and "--listen /ip4/0.0.0.0/tcp/<port>" in note
    assert loopback_note(["/ip6/::1/tcp/0"], [f"/ip6/2001:db8::1/tcp/4001{PEER}"]) is not None


def test_no_note_when_it_does_not_matter() -> None:
    local = [f"/ip4/127.0.0.1/tcp/4001{PEER}"]
    assert loopback_note(["/ip4/127.0.0.1/tcp/0"], local) is None  # a swarm on this machine
    assert loopback_note(["/ip4/0.0.0.0/tcp/0"], [f"/ip4/203.0.113.7/tcp/1{PEER}"]) is None
    assert loopback_note(["/ip4/127.0.0.1/tcp/0"], []) is None
