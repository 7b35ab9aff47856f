"""Benchmarks: `swarm-node bench NAME` imports `bench.NAME` and calls its `run`.

Each module defines `run(quick: bool, args: list[str]) -> dict`; progress goes to stderr,
and the CLI prints the returned dict as one JSON line, last.
"""
