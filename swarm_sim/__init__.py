"""Virtual-time simulator driving the same `protocol` rules over many virtual peers.

The code is organized as follows:

- `core.py`: the discrete-event core: a virtual clock and a heap of scheduled callbacks.
- `core_choice.py`: the timing that chose a plain heap for the core (run it to repeat it).
- `network.py`: the network model: regions, latency, bandwidth queues, loss, CPU cost.
- `bounds.py`: lower bounds: the earliest arrival and the fastest broadcast.
- `gossipsub.py`: a GossipSub v1.1 mesh model: per-peer router state and heartbeat rules.
- `messages.py`: stand-in messages opened by the real admission, without signatures.
- `churn.py`: how long peers stay, how long they are away, how they leave.
- `adversary.py`: what byzantine virtual peers do.
- `swarm.py`: the simulated swarm: virtual peers running the real admission rules.
- `broadcast.py`: a checkpoint broadcast through the swarm, shard by shard.
- `metrics.py`: what a simulation measures and its summary figures.
- `scenario.py`: scenarios (TOML files, built-ins in `scenarios/`) -> every model's settings.
- `runner.py`: run a scenario and gather results and plot series.
- `report.py`: write a run's results.json, plots and report.md.
"""

from swarm_sim.broadcast import BroadcastConfig, simulate_broadcast
from swarm_sim.report import write_outputs
from swarm_sim.runner import RunInfo, run_scenario
from swarm_sim.scenario import Scenario, ScenarioError
from swarm_sim.swarm import Swarm, Workload

__all__ = [
    "BroadcastConfig",
    "RunInfo",
    "Scenario",
    "ScenarioError",
    "Swarm",
    "Workload",
    "run_scenario",
    "simulate_broadcast",
    "write_outputs",
]
