"""One running peer of a run: the IO shell around `protocol.admission` and its drivers.

The code is organized as follows:

- `peer.py`: `Peer` and `open_peer()`: every event goes through admission, one executor
  carries out its actions.
- `config.py`: `PeerConfig`, what a peer needs to join a run.
- `gossip.py`: per-run gossip topics and a paced outbox.
- `body_puller.py`: pulling rollout bodies (rules: `protocol.body_pull`).
- `services.py`: the body server and the catch-up driver.
- `upkeep.py`: periodic upkeep: ticks, saving scores, retention.
- `discovery.py`: bootstrap list, peer exchange and redial with backoff.
- `dropped_by.py`: peers that refuse this node.
- `run_service.py`: serving, pulling and adopting the run release.
- `nat_upkeep.py`: AutoNAT checks and relay slots when not reachable.
- `stats.py`: latency percentiles for status.
"""
