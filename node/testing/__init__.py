"""The harness tests and benchmarks share: synthetic records, peer processes driven over
JSON lines, and an emulated network of Linux namespaces. Only `swarm_node_bench` and
`tests/` import it (tests/test_layout_imports.py holds that).

The code is organized as follows:

- `records.py`: synthetic but well-formed signed rollout records, proof pools, the run manifest of the network tests
- `adversary_records.py`: the adversary lab's stand-in model (true reward, model change) and its honest or lying records
- `peer_process.py`: `PeerProcess`, the driver of one peer process, and the peer side of its JSON-lines channel
- `gossip_peer.py`: a bare gossip peer process (`python -m node.testing.gossip_peer`)
- `net_peer.py`: a full peer process producing synthetic records (`python -m node.testing.net_peer`)
- `nat_peer.py`: a host with circuit relay v2, AutoNAT and DCUtR as a process; `start_in` starts one in a namespace
- `netlab.py`: `NetLab`, an emulated network of namespaces with peers behind cone and symmetric NATs
- `reach_join.py`: `FullStack`, a worker of the full role stack joining a public run from behind NAT
- `dcutr_flood.py`: py-libp2p's DCUtR handler on a stand-in host whose network counts dial attempts
- `relay_flood.py`: reservation requests at once from one IP to the relay's reservation handler
- `conn_attacks.py`: connection and GossipSub-control attacks from plain py-libp2p hosts, and the honest probe

The process modules (`gossip_peer`, `net_peer`, `nat_peer`) are run with `python -m` and are
not re-exported here: a module the package had already imported would run twice. Neither is
`conn_attacks`, which imports py-libp2p: importing the records must stay light (the
simulator benchmark measures its own memory).
"""

from node.testing.adversary_records import (
    CHANGED_MARK,
    SLIGHT_MARK,
    VERSION,
    honest_record,
    manifest,
    model_change,
    true_reward,
)
from node.testing.netlab import NAT_KINDS, PUBLIC_IP, NetLab, unavailable
from node.testing.peer_process import PeerProcess, json_lines, reply
from node.testing.reach_join import FullStack, read_status, small_run
from node.testing.records import PROOF_BYTES, make_proof_pool, net_manifest, synthetic_record

__all__ = [
    "CHANGED_MARK",
    "NAT_KINDS",
    "PROOF_BYTES",
    "PUBLIC_IP",
    "SLIGHT_MARK",
    "VERSION",
    "FullStack",
    "NetLab",
    "PeerProcess",
    "honest_record",
    "json_lines",
    "make_proof_pool",
    "manifest",
    "model_change",
    "net_manifest",
    "read_status",
    "reply",
    "small_run",
    "synthetic_record",
    "true_reward",
    "unavailable",
]
