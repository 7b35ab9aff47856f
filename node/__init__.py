"""The running peer: libp2p host adapter, roles, storage, configuration and the CLI."""
