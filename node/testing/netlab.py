"""An emulated network of Linux network namespaces: a public segment and peers behind NAT
routers, for the NAT tests and `bench reach`. Needs root, `ip` and `iptables`.

Layout (every name carries a per-lab tag, so labs never collide and nothing outside them is
touched): namespace `<tag>-wan` holds a bridge with 10.77.0.1/24 (the public peers listen
there); each NAT `i` is a router namespace `<tag>-r<i>` (10.77.0.<10+i> on the bridge,
192.168.<i>.1 inside, MASQUERADE to the public side) and a host namespace `<tag>-h<i>`
(192.168.<i>.2, default route via its router). The cone kind keeps a connection's source
port where it can (one mapping per local port, what TCP hole punching needs); the
symmetric kind (`MASQUERADE --random`) maps each connection to a random port. Both drop
unsolicited packets from outside.
`close()` deletes the namespaces, which removes their links and rules.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess

PUBLIC_IP = "10.77.0.1"
NAT_KINDS = ("cone", "symmetric")


def unavailable() -> str | None:
    """None when this machine can build a lab, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (.ci/run installs iptables through apt)"
    probe = f"swprobe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        nat = subprocess.run(
            ["ip", "netns", "exec", probe, "iptables", "-t", "nat", "-L", "-n"],
            capture_output=True,
            text=True,
        )
        if nat.returncode != 0:
            return f"iptables NAT does not work in a namespace: {nat.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetLab:
    """One emulated network; use as a context manager (or call `close()`)."""

    def __init__(self) -> None:
        self.tag = f"sw{secrets.token_hex(3)}"
        self.namespaces: list[str] = []
        self.wan = self._netns("wan")
        self._ip(self.wan, "link", "set", "lo", "up")
        self._ip(self.wan, "link", "add", "br0", "type", "bridge")
        self._ip(self.wan, "addr", "add", f"{PUBLIC_IP}/24", "dev", "br0")
        self._ip(self.wan, "link", "set", "br0", "up")
        self.nats: list[str] = []

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _netns(self, name: str) -> str:
        ns = f"{self.tag}-{name}"
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        return ns

    @staticmethod
    def _ip(ns: str, *args: str) -> None:
        _run("ip", "-n", ns, *args)

    def add_nat(self, kind: str) -> str:
        """A host behind a new NAT router of `kind`; returns the host's namespace."""
        if kind not in NAT_KINDS:
            raise ValueError(f"NAT kind must be one of {NAT_KINDS}, got {kind!r}")
        i = len(self.nats) + 1
        router, host = self._netns(f"r{i}"), self._netns(f"h{i}")
        self._ip(
            self.wan, "link", "add", f"w{i}", "type", "veth", "peer", "name", "wan", "netns", router
        )
        self._ip(self.wan, "link", "set", f"w{i}", "master", "br0", "up")
        self._ip(router, "addr", "add", f"10.77.0.{10 + i}/24", "dev", "wan")
        self._ip(
            router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", host
        )
        self._ip(router, "addr", "add", f"192.168.{i}.1/24", "dev", "lan")
        for dev in ("lo", "wan", "lan"):
            self._ip(router, "link", "set", dev, "up")
        self._ip(host, "addr", "add", f"192.168.{i}.2/24", "dev", "eth0")
        for dev in ("lo", "eth0"):
            self._ip(host, "link", "set", dev, "up")
        self._ip(host, "route", "add", "default", "via", f"192.168.{i}.1")
        _run("ip", "netns", "exec", router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        rule = ["-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"]
        _run(
            "ip",
            "netns",
            "exec",
            router,
            "iptables",
            *rule,
            *(["--random"] if kind == "symmetric" else []),
        )
        # Unsolicited packets from outside are dropped (as home routers do), not answered
        # with a reset that would abort the other side's hole-punch dial.
        _run(
            "ip",
            "netns",
            "exec",
            router,
            "iptables",
            "-A",
            "INPUT",
            "-i",
            "wan",
            "-m",
            "conntrack",
            "!",
            "--ctstate",
            "ESTABLISHED,RELATED",
            "-j",
            "DROP",
        )
        self.nats.append(host)
        return host

    @staticmethod
    def host_ip(ns: str) -> str:
        """The address a peer in host namespace `ns` listens on."""
        return f"192.168.{int(ns.rsplit('-h', 1)[1])}.2"

    def close(self) -> None:
        """Delete every namespace this lab made (the links go with them)."""
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces.clear()


def _run(*cmd: str) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
