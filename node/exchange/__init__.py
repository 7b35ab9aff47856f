"""The request/response stream protocols a peer speaks besides gossip.

The code is organized as follows:

- `request_response.py`: the one layer under them all: `ExchangeSpec` (protocol id, codecs
  with their byte caps, concurrency, deadline), `serve()`, `request()`, `open_call()`.
- `fields.py`: msgpack message shapes (`Fields`, `OneOf`, `Nullable`...) as `protocol.schema` specs.
- `rollouts.py`: `/swarm-rl/<run>/rollout/1`, pulling rollout bodies.
- `sync.py`: `/swarm-rl/<run>/sync/1`, catch-up after a restart.
- `shards.py`: `/swarm-rl/<run>/shard/1`, have-maps, manifests and weight shards.
- `runs.py`: `/swarm-rl/runs/1`, which runs a peer serves.

The hello exchange (`/swarm-rl/<run>/hello/1`) is declared beside its driver,
`node.peer.discovery`, on the same layer.
"""

from node.exchange.request_response import (
    BadMessage,
    BadRequest,
    BadResponse,
    Call,
    Codec,
    CodecError,
    ExchangeSpec,
    Frame,
    Frames,
    Inbound,
    MsgpackCodec,
    OptionalRaw,
    Raw,
    Server,
    StreamHost,
    open_call,
    receive_message,
    request,
    send_message,
    serve,
)

__all__ = [
    "BadMessage",
    "BadRequest",
    "BadResponse",
    "Call",
    "Codec",
    "CodecError",
    "ExchangeSpec",
    "Frame",
    "Frames",
    "Inbound",
    "MsgpackCodec",
    "OptionalRaw",
    "Raw",
    "Server",
    "StreamHost",
    "open_call",
    "receive_message",
    "request",
    "send_message",
    "serve",
]
