"""The libp2p adapter: the only package that imports py-libp2p.

The code is organized as follows:

- `host.py`: `SwarmHost` and `open_host()`, a running libp2p host (TCP + Noise + Yamux) with
  GossipSub, bans and framed request streams; `HostSettings`.
- `framed_stream.py`: length-prefixed frames over a libp2p stream, and the adapter's errors.
- `gossip.py`: subscribe with validators, size-checked and paced publishing.
- `gossip_guard.py`: GossipSub control traffic limited per peer.
- `heartbeat.py`: the application heartbeat (the standard ping) and event-loop stall tracking.
- `limits.py`: connection limits: total, per peer and per IP.
- `listen.py`: listen-address checks and failure explanations.
- `goodbye.py`: telling a refused peer why, and hearing that a peer refuses us.
- `identify.py`: what a peer tells us over libp2p identify.
- `relay.py`: circuit relay v2, the service with limits and the client.
- `reachability.py`: AutoNAT dial-back and DCUtR hole punching.
- `libp2p_patches.py`: the patches of py-libp2p 0.8.1 internals, applied once.
"""
