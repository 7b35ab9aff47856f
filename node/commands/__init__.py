"""One module per `swarm-node` command; `node.cli` imports them lazily so `--help` stays fast."""
