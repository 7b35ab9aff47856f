"""The `swarm-node` commands: one module per command, each holding its click definition
(`command`, or as `node.cli.COMMANDS` names it) beside its implementation (`main`). The
group in `node.cli` imports a module only when its command is looked up; heavy libraries
are imported inside the functions that need them.

The code is organized as follows:

- addrs.py: multiaddrs from the command line (`--listen`, `--bootstrap`, `--join`), checked
- audit.py: `audit`: check rollout records (proofs, replay, log-probs, reward)
- bench.py: `bench NAME`: run a benchmark of the package `BENCH_PACKAGE`
- calibrate.py: `calibrate`: measure honest variation, write the audit limits
- devnet.py: `devnet`: a local swarm of real node processes on loopback
- devnet_evaluation.py: the devnet's closing evaluation on held-out tasks
- devnet_nodes.py: one node process of a devnet (`NodeProc`)
- devnet_report.py: the devnet's report: totals, report.json, plots, summary
- doctor.py: `doctor`: can this machine join a run
- init_model.py: `init-model`: build the built-in tiny policy
- keys.py: `keygen` and `id`
- ledger.py: `ledger`: the node's ledger, line by line
- rollouts.py: `rollouts`: signed rollout records offline
- run_sign.py: `run sign`: release a run file as its authority
- runs.py: `runs`: the runs that bootstrap peers serve
- sim.py: `sim`: the swarm simulator
- start.py: `start`: join a run as one role (options from `node.config`)
- start_run.py: which run `start` joins: the run file or the network
- status.py: `status`: what a node's data directory says about it
- train.py: `train`: the trainer's loop, offline
"""
