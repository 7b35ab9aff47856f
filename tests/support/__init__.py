"""Helpers the tests share (one copy each): polling in trio tests (`polling.until`), peer
configurations (`peers`), the CLI in a subprocess (`cli.run_cli`), and the audit
environment of the verify tests (`audit_env.env`, a module-scoped fixture). Fixtures the
benchmarks use too (synthetic records, the run manifest of the network benches, the peer
processes, the emulated network) live in `node.testing` and the tests import them from there."""
