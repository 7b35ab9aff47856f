"""Full and read-only disks: every writer says so in one line and leaves no temporary
file: the key writer (`keygen`), the status writer of a running node (one warning, retried
with backoff, the node runs on) and the weight shard writer (one warning, downloads paused
with backoff, no retry flood); `node.disk_trouble` holds the backoff."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from node.commands import start
from node.disk_trouble import DiskTrouble
from node.peer.peer import open_peer
from node.weights.store import WeightsError
from tests.support.cli import run_cli
from tests.support.disks import read_only_dir, tiny_disk
from tests.support.polling import until
from tests.test_node_weights import cfg, ckpt, run_manifest


def _fill(where: Path) -> None:
    """Write until the disk at `where` is full."""
    with open(where / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


def test_backoff_doubles_reports_once_and_recovers() -> None:
    d = DiskTrouble(first_s=5.0, max_s=20.0)
    assert d.ready(0.0) and d.pause_s() == 0.0
    assert d.failed(0.0) is True and d.retry_at == 5.0
    assert d.failed(1.0) is False and d.retry_at == 5.0  # a write started before the pause
    assert not d.ready(4.9) and d.ready(5.0)
    assert d.failed(5.0) is False and d.retry_at == 15.0
    assert d.failed(15.0) is False and d.retry_at == 35.0  # capped at max_s
    assert d.ok() is True and d.ready(0.0)
    assert d.ok() is False


def test_keygen_on_a_full_and_a_read_only_disk_is_one_line_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    with tiny_disk(tmp_path) as disk:
        _fill(disk)
        r = run_cli("keygen", "--out", str(disk / "k.key"))
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "No space left" in r.stderr, r.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    with read_only_dir(tmp_path) as ro:
        r = run_cli("keygen", "--out", str(ro / "k.key"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr and list(ro.iterdir()) == []


def test_status_writer_on_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    with tiny_disk(tmp_path) as disk:
        _fill(disk)
        with pytest.raises(OSError):
            start.write_status(disk, {"big": "x" * 100_000})
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


async def test_status_loop_warns_once_and_runs_on(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    peer = SimpleNamespace(stats=lambda: {"big": "x" * 100_000})
    io = SimpleNamespace(status={})
    caplog.set_level(logging.WARNING, logger="swarm.node")
    with tiny_disk(tmp_path) as disk:
        _fill(disk)
        with trio.move_on_after(3.5):  # the loop ran on: no exception left it
            await start._status_loop(peer, cast(Any, io), disk)
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "retrying with backoff" in warnings[0], warnings


async def test_shard_writer_on_a_full_disk_warns_once_and_backs_off(
    tmp_path: Path, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    from protocol.identity import Identity

    caplog.set_level(logging.WARNING, logger="swarm")
    trainer = Identity.generate()
    manifest = run_manifest("full", trainer)
    async with open_peer(cfg(tmp_path, "t", manifest, trainer)) as t:
        assert t.weights is not None
        await t.weights.publish(ckpt(0))
        async with open_peer(
            cfg(tmp_path, "a", manifest, bootstrap=(t.host.listen_addrs()[0],))
        ) as a:
            w = a.weights
            assert w is not None
            await until("v0", lambda: w.newest() == 0)

            def full_disk(*_a, **_k):  # type: ignore[no-untyped-def]
                raise WeightsError("disk full while writing 1.full")

            monkeypatch.setattr(w.store, "put_shard", full_disk)
            await t.weights.publish(ckpt(1, base_seed=7))  # every shard new
            await until("a shard write failed", lambda: w.counters.get("shard_write_failed", 0))
            failed = w.counters["shard_write_failed"]
            await trio.sleep(2.0)  # within the 5 s pause: nothing more is asked for
            assert w.counters["shard_write_failed"] == failed
            monkeypatch.undo()
            await until("v1 after space came back", lambda: w.newest() == 1, timeout=40)
    paused = [r.getMessage() for r in caplog.records if "downloads paused" in r.getMessage()]
    assert len(paused) == 1, paused
    assert any("written again" in r.getMessage() for r in caplog.records)
