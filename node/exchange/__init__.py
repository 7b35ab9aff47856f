"""The request/response stream protocols a peer speaks besides gossip.

The code is organized as follows:

- `rollouts.py`: `/swarm-rl/<run>/rollout/1`, pulling rollout bodies.
- `sync.py`: `/swarm-rl/<run>/sync/1`, catch-up after a restart.
- `shards.py`: `/swarm-rl/<run>/shard/1`, have-maps, manifests and weight shards.
- `runs.py`: `/swarm-rl/runs/1`, which runs a peer serves.
"""
