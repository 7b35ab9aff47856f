"""Benchmarks: `swarm-node bench NAME` imports `swarm_node_bench.NAME` and calls its `run`.

Each module defines `run(quick: bool, args: list[str]) -> dict`; progress goes to stderr,
and the CLI prints the returned dict as one JSON line, last. The harness shared with the
tests (records, peer processes, the emulated network) is `node.testing`.

The code is organized as follows:

- `adversary.py`: the network's rules against attackers (real peer processes on loopback)
- `broadcast.py`: weight broadcast figures (deltas, shards, real processes)
- `churn.py`: delivery under crashes and restarts of full peers on loopback
- `codec.py`: encode, decode, sign and verify rates of the wire format, and the decoder fuzz
- `generate.py`: generation figures on the built-in tiny policy (and vLLM where installed)
- `gossip.py`: rollout gossip among real peer processes on loopback
- `learn.py`: does training make the built-in policy better, and what helps
- `reach.py`: peers behind NAT on an emulated network: reachability and join time
- `scale.py`: the node's work on a Qwen2-shaped 0.5B–7B model, each part in a capped child
- `sim.py`: the simulator's speed and what it predicts, side by side
- `verify.py`: proofs and audits: what passes, what fails
- `parts/`: pieces that one benchmark uses (its peer processes, attacks, model edits)

Nothing is re-exported here: the `bench` command resolves a benchmark by name, and importing
this package must not import every benchmark (their dependencies are heavy).
"""
