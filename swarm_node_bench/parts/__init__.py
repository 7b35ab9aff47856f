"""Pieces that one benchmark uses, apart from its `run` (the harness shared with the tests
is `node.testing`).

The code is organized as follows:

- `adv_peer.py`: one peer process of `bench adversary` (`python -m swarm_node_bench.parts.adv_peer`)
- `authority.py`: `bench adversary`'s `equivocation` (real peers, a split by an equivocating trainer key) and `validators` sections
- `attacks.py`: the attacks of `bench adversary`, each by a fresh attacker identity and peer
- `broadcast_real.py`: `bench broadcast`'s real part: 1 origin + N receivers as processes on loopback
- `weights_peer.py`: one peer process of that real part (`python -m swarm_node_bench.parts.weights_peer`)
- `generate_vllm.py`: the vLLM part of `bench generate`
- `reach_hostile.py`: `bench reach --hostile`: the join path under attack, one case each
- `learn_sapo.py`: `bench learn`'s `sapo` grid
- `learn_swarm.py`: `bench learn`'s `efficiency` and `devnet` parts
- `sequential_power.py`: the sequential producer rule's false positives and power, simulated (`python -m swarm_node_bench.parts.sequential_power`)
- `scale_runner.py`: `bench scale`'s parts in child processes under a memory cap
- `scale_child.py`: one such child (`python -m swarm_node_bench.parts.scale_child`)
- `scale_model.py`: the model directory, run manifest and memory estimates of `bench scale`
- `scale_gen.py`, `scale_audit.py`, `scale_train.py`, `scale_weights.py`, `scale_e2e.py`: its parts
- `verify_models.py`: the changed models `bench verify`'s cases generate with
- `verify_records.py`: how `bench verify` makes, doctors and audits signed records
- `window_statistic.py`: which window statistic catches a partly changed window (`python -m swarm_node_bench.parts.window_statistic`)

The modules are imported by the benchmark that uses them, not re-exported here: the
process modules are run with `python -m` (a module the package had already imported would
run twice) and the others defer heavy imports that one benchmark alone should pay.
"""
