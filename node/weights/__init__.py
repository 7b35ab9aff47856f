"""Policy versions on a running peer: stored, served, fetched and installed.

The code is organized as follows:

- `store.py`: the weights on disk: signed manifests, verified shards, installed versions.
- `serve.py`: what a peer offers other peers' fetches.
- `sync.py`: publish (trainer), fetch and install (everyone).
- `upload_limit.py`: the node-wide upload cap, a token bucket.

Its modules are imported by name: `sync` and `serve` import the libp2p adapter, which the
commands that only read `store` (`status`) do without.
"""
