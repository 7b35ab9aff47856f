"""`swarm-node start`: join a training run as one role (inference, trainer, validator, relay).

    swarm-node start --role inference --run RUN.toml --key KEY \\
        --listen /ip4/0.0.0.0/tcp/4001 --bootstrap /ip4/1.2.3.4/tcp/4001/p2p/12D3KooW... \\
        --data-dir DIR [--model DIR]
    swarm-node start --role inference --join MULTIADDR [--authority PEER_ID] --key KEY

`--join` finds the run on the network instead of a run file: the bootstrap peer serves the
run's signed manifest, checked against `--authority` (or trusted on first use and pinned
beside the node's data; `node.commands.start_run`).

Start-up prints the peer id, the listen addresses, the run joined and how many peers were
reached; when a bootstrap peer does not answer it says which address failed and why (and
keeps retrying with backoff). SIGUSR1 stops making new work (an inference worker finishes
its batch, then only serves). While running it writes `<data dir>/status.json` once a
second (what `swarm-node status` and `swarm-node devnet` read). SIGINT or SIGTERM stop it
cleanly: publishes drain, the host closes (port released), the store closes. One process
per data directory (a lock file refuses a second one); several roles per machine are fine
with separate data directories.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import trio

from node import metrics
from node.cli_errors import one_line_errors
from node.commands import start_run
from node.commands.addrs import check_addrs, check_listen, loopback_note
from node.config import NodeConfig, config_options, flag_overrides, load_config
from node.console import sayer
from node.dashboard import History
from node.disk_trouble import DiskTrouble
from node.errors import CommandError
from node.keyfile import read_key
from node.log_format import configure
from node.model_fetch import fetched_dir, fetched_version, read_bundle_files
from node.paths import model_roots, node_dir, required_path
from node.roles import RoleConfig, RoleIO, check_local, check_role_device, role_module
from node.run_file import load_run_release
from protocol.content_id import content_id
from protocol.model_bundle import encode_bundle
from trainer.checkpoint import CheckpointError, ModelDirWeights, model_dir_weights
from trainer.model_dir import ModelDirError, check_model_dir

STATUS_FILE = "status.json"
LOCK_FILE = "node.lock"


_say = sayer(stdout=True)


def _metrics_addr(text: str) -> tuple[str, int] | None:
    """`--metrics HOST:PORT` as (host, port); empty: no endpoint."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--metrics: expected HOST:PORT (e.g. 127.0.0.1:9464), got {text!r}")
    return host.strip("[]"), int(port)


def _lock(data_dir: Path) -> Any:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fh = open(data_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process lifetime
    except OSError as exc:
        raise CommandError(f"cannot use data directory {data_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise CommandError(
            f"data directory {data_dir} is in use by another swarm-node process; "
            "give each node its own --data-dir"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def write_status(data_dir: Path, status: dict[str, Any]) -> None:
    """Atomically replace `<data dir>/status.json`; an `OSError` (a full or read-only
    disk) leaves no temporary file behind."""
    tmp = data_dir / f".{STATUS_FILE}.tmp"
    try:
        tmp.write_text(json.dumps(status))
        os.replace(tmp, data_dir / STATUS_FILE)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def _base_weights(model_dir: Path, manifest: Any) -> ModelDirWeights:
    """The model directory's weights (policy version 0) by path and canonical digest,
    checked against the run manifest's `model_digest` when it names one; the files are
    hashed as they are read and nothing of them is kept."""
    try:
        base = model_dir_weights(model_dir)
    except (CheckpointError, OSError) as exc:
        raise CommandError(f"--model: {exc}") from None
    digest = base.digest
    if manifest.model_digest and digest != manifest.model_digest:
        raise CommandError(
            f"--model: the weights in {model_dir} have digest {digest.hex()}, the run manifest's "
            f"model_digest is {manifest.model_digest.hex()}: not the run's model"
        )
    return base


def _serve_model(peer: Any, manifest: Any, model_dir: Path) -> None:
    """Serve what joiners fetch of the run's model: the bundle of `model_dir`'s files when
    it is the one the run pins, and version 0's weights when they are installed."""
    blobs: dict[bytes, bytes | Path] = {}
    if manifest.model_files_digest:
        bundle = encode_bundle(read_bundle_files(model_dir))
        if content_id(bundle) == manifest.model_files_digest:
            blobs[manifest.model_files_digest] = bundle
    if manifest.model_digest and peer.weights.installed().get(0) == manifest.model_digest:
        blobs[manifest.model_digest] = peer.weights.path(0)
    if blobs:
        from node.exchange.model_files import serve_model  # deferred: heavy import

        serve_model(peer.host, manifest.run_id, blobs, peer.bad_request)


def parse_local_train(value: str | None, role: str | None) -> tuple[int, int] | None:
    """`--local-train I:J` as (I, J); only an inference peer trains locally."""
    if value is None:
        return None
    try:
        own, foreign = (int(x) for x in value.split(":"))
    except ValueError:
        raise CommandError(f"--local-train: expected I:J (e.g. 4:4), got {value!r}") from None
    if own < 0 or foreign < 0 or own + foreign < 1 or own + foreign > 256:
        raise CommandError(f"--local-train: need I, J >= 0 and 1 <= I + J <= 256, got {value!r}")
    if role != "inference":
        raise CommandError(
            "--local-train is for --role inference (a trainer publishes; it does not train locally)"
        )
    return own, foreign


@dataclass(frozen=True)
class StartOptions:
    """What `start` takes besides the configuration tree: how long and how much to run,
    local training, and where to find the run on the network."""

    max_rollouts: int | None = None
    local_train: str | None = None
    duration: float | None = None
    join: tuple[str, ...] = ()
    authority: str | None = None


@click.command()
@config_options
@click.option("--config", type=click.Path(path_type=Path), help="Node configuration TOML.")
@click.option("--max-rollouts", type=int, help="Inference: stop producing after this many.")
@click.option(
    "--local-train",
    metavar="I:J",
    help="Inference: train an own copy on I own + J swarm groups a round (never published).",
)
@click.option("--duration", type=float, help="Stop by itself after this many seconds.")
@click.option(
    "--join",
    multiple=True,
    metavar="MULTIADDR",
    help="Find the run at this peer instead of --run (repeatable; also a bootstrap peer).",
)
@click.option(
    "--authority",
    metavar="PEER_ID",
    help="With --join: the run authority to trust (default: trust on first use).",
)
@one_line_errors
def command(config: Path | None, join: tuple[str, ...], **kwargs: Any) -> None:
    """Join a training run as one role (inference, trainer, validator, relay)."""
    # Until the node runs (it then handles both signals itself and exits 0 once stopped),
    # SIGTERM stops start-up as SIGINT does; either way the exit status is 0.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # (a parent may have blocked it until now: `swarm-node devnet` does, so that a
        # SIGTERM sent while this process was still importing is taken here, not fatal there)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        cfg = load_config(config, flag_overrides(kwargs))
        main(cfg, StartOptions(join=tuple(join), **kwargs))
    except KeyboardInterrupt:
        click.echo("swarm-node: stopped before it was running", err=True)
    except BaseExceptionGroup as group:  # raised inside a trio nursery
        if group.split(KeyboardInterrupt)[1] is not None:
            raise
        click.echo("swarm-node: stopped before it was running", err=True)


def main(cfg: NodeConfig, opts: StartOptions | None = None) -> None:
    """Run a node until SIGINT/SIGTERM or `opts.duration` seconds; see the module docstring.
    `cfg` is the file with the flags applied; paths resolve as `node.paths` says."""
    opts = opts or StartOptions()
    role = cfg.node.role
    if role == "trainer" and os.environ.get("RANK", "0") not in ("", "0"):
        _follow(cfg)  # a rank > 0 of a trainer under torchrun: no key, run or network
        return
    _check_limits(opts.duration, opts.max_rollouts)
    split = parse_local_train(opts.local_train, role)
    metrics_at = _metrics_addr(cfg.node.metrics)
    listen_addrs = check_listen(cfg.node.listen)
    boot = check_addrs(cfg.node.bootstrap, "--bootstrap", need_peer=True)
    join_addrs = check_addrs(opts.join, "--join", need_peer=True)
    boot += [a for a in join_addrs if a not in boot]
    _usage_checks(cfg, join_addrs)
    _configure_logging(cfg)
    run_choice, identity, ddir = _run_key_and_dir(cfg, role, join_addrs, opts.authority)
    manifest = run_choice.manifest
    from node import settings  # deferred: heavy import

    role_config = settings.role_config(
        cfg,
        data_dir=ddir,
        max_rollouts=opts.max_rollouts,
        local_train=split,
    )
    io = RoleIO(say=lambda m: _say(f"  {m}"))
    check_role_device(role, role_config, manifest)  # before a model is fetched, too
    role_config, fetch_to = _model_or_fetch(role, role_config, manifest, bool(join_addrs))
    # the model and datasets: checked before the network (a model to fetch: after joining)
    model_dir = None if fetch_to is not None else check_local(role, role_config, manifest)
    base = (
        _base_weights(model_dir, manifest)
        if model_dir is not None and fetched_version(model_dir) in (None, 0)
        else None
    )
    lock = _lock(ddir)
    try:
        trio.run(
            _run,
            role,
            manifest,
            identity,
            ddir,
            listen_addrs,
            boot,
            role_config,
            io,
            cfg,
            opts.duration,
            base,
            metrics_at,
            run_choice,
            model_dir or fetch_to,
            fetch_to is not None,
        )
    finally:
        lock.close()


def _follow(cfg: NodeConfig) -> None:
    """Be one of the trainer's ranks > 0 (`trainer.follower`): rank 0 sends the setup."""
    from node import settings  # deferred: heavy import
    from trainer.devices import DeviceError, resolve_device  # deferred: heavy import
    from trainer.distributed import RankEnv, RankError  # deferred: heavy import
    from trainer.follower import follow  # deferred: heavy import

    try:
        env = RankEnv.from_env()
        if env is None:
            raise CommandError("RANK is set but WORLD_SIZE is not: start it under torchrun")
        follow(env, resolve_device(cfg.node.device), settings.role_threads(cfg))
    except (RankError, DeviceError) as exc:
        raise CommandError(str(exc)) from None


FETCHING_ROLES = ("inference", "validator")  # roles that may fetch the run's model


def _model_or_fetch(
    role: str, config: RoleConfig, manifest: Any, joining: bool
) -> tuple[RoleConfig, Path | None]:
    """(the role's config, the directory to fetch the run's model into, or None). A node
    that joins a run, was given no `--model` and finds no model directory of the run's
    fetches the model from its peers when the run pins its files (`model_files_digest`):
    into `<data root>/models/run-<digest>/`, used as is when already there."""
    model = getattr(config, "model", None)
    if not joining or model is None or model.model or role not in FETCHING_ROLES:
        return config, None
    try:
        check_local(role, config, manifest)
        return config, None
    except CommandError:
        if not manifest.model_files_digest:
            raise
    dest = fetched_dir(model_roots(model.models_dir)[0], manifest.model_files_digest)
    config = dataclasses.replace(config, model=dataclasses.replace(model, model=str(dest)))
    try:
        check_model_dir(dest)
        return config, None  # fetched before
    except ModelDirError:
        return config, dest


def _check_limits(duration: float | None, max_rollouts: int | None) -> None:
    if duration is not None and not duration > 0:
        raise CommandError(f"--duration must be positive, got {duration}")
    if max_rollouts is not None and max_rollouts < 1:
        raise CommandError(f"--max-rollouts must be >= 1, got {max_rollouts}")


def _usage_checks(cfg: NodeConfig, join: list[str]) -> None:
    """The key and the run file read before the heavy imports, so that a missing or bad
    one is answered at once (they are read again where they are used)."""
    if join and cfg.node.run:
        raise CommandError("give --run RUN.toml or --join MULTIADDR, not both")
    read_key(required_path(None, cfg.node.key, "--key", "node.key"))
    if not join:
        load_run_release(required_path(None, cfg.node.run, "--run", "node.run"))


def _configure_logging(cfg: NodeConfig) -> None:
    """Our log level and format, py-libp2p's loggers quiet unless at debug, matplotlib's
    font-cache lines hidden."""
    configure(cfg.node.log_level, cfg.node.log_format)
    # py-libp2p logs every failed dial at ERROR; our own lines already say what failed.
    # (Import it first: importing libp2p resets its loggers' levels.)
    import node.host.host  # noqa: F401  # deferred: heavy import

    quiet = logging.DEBUG if cfg.node.log_level == "debug" else logging.CRITICAL
    for noisy in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(noisy).setLevel(quiet)
        # py-libp2p detaches its logger (no handler, no propagation): at debug its lines
        # went out bare through logging's last resort; ours carry them in our format
        logging.getLogger(noisy).propagate = quiet == logging.DEBUG
    # matplotlib (imported for plots) logs building its font cache at INFO on a fresh machine
    logging.getLogger("matplotlib").setLevel(max(logging.WARNING, logging.getLogger().level))


def _run_key_and_dir(
    cfg: NodeConfig, role: str, join: list[str], authority: str | None
) -> tuple[Any, Any, Path]:
    """(`node.commands.start_run.RunChoice`, identity, data directory): the run from the
    run file, or found through `--join`; says so when a trainer's key is not one of the
    run's trainer keys."""
    from node import settings  # deferred: heavy import

    flag = start_run.parse_authority(authority)
    if join and cfg.node.run:
        raise CommandError("give --run RUN.toml or --join MULTIADDR, not both")
    run_path = None if join else required_path(None, cfg.node.run, "--run", "node.run")
    identity = read_key(required_path(None, cfg.node.key, "--key", "node.key"))
    ddir = node_dir(cfg.node.data_dir, identity.peer_id_b58, role)
    if run_path is not None:
        choice = start_run.from_run_file(run_path, ddir, flag)
    else:
        choice = start_run.from_network(join, ddir, flag, settings.host_settings(cfg))
    manifest = choice.manifest
    if role == "trainer" and identity.peer_id not in manifest.trainer_keys:
        _say(
            "  trainer: this key is not in the run's trainer_keys: training, but no peer "
            "will accept the versions it publishes (add its peer id to the run file)"
        )
    return choice, identity, ddir


async def _run(
    role: str,
    manifest: Any,
    identity: Any,
    data_dir: Path,
    listen: list[str],
    boot: list[str],
    role_config: RoleConfig,
    io: RoleIO,
    cfg: NodeConfig,
    duration: float | None,
    base: ModelDirWeights | None = None,
    metrics_at: tuple[str, int] | None = None,
    run_choice: Any = None,
    model_dir: Path | None = None,
    fetch_model_first: bool = False,
) -> None:
    from node.host.host import ListenFailed  # deferred: heavy import
    from node.peer.peer import open_peer  # deferred: heavy import

    module = role_module(role)
    local_train = getattr(role_config, "local_train", None) is not None
    pcfg = _peer_config(manifest, identity, data_dir, listen, boot, local_train, cfg, module)
    scrape = await _bind_metrics(
        metrics_at
    )  # before joining: a busy port fails before any network IO
    try:
        async with open_peer(pcfg) as peer:
            if run_choice is not None:
                from node.peer.run_service import RunService  # deferred: heavy import

                RunService(peer, run_choice.release, run_choice.pin)  # serves until the host closes
            if fetch_model_first and model_dir is not None:
                from node.model_fetch import fetch_model  # deferred: heavy import

                base = await fetch_model(peer, manifest, model_dir, io.say)
            if base is not None and peer.weights is not None:
                await peer.weights.adopt_base(base)  # version 0: the model directory
            if model_dir is not None and peer.weights is not None:
                _serve_model(peer, manifest, model_dir)
            _say_started(
                peer, role, manifest, data_dir, boot, metrics_at if scrape is not None else None
            )
            await _serve(peer, module, role_config, io, data_dir, scrape, duration)
            try:
                write_status(data_dir, {**_status(peer, io), "stopped": True})
            except OSError as exc:  # a full or read-only disk: said, not a failure to stop
                _say(f"swarm-node: cannot write {data_dir / STATUS_FILE}: {exc.strerror or exc}")
    except ListenFailed as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot listen on {', '.join(listen)}: {exc.strerror or exc}") from None
    finally:
        if scrape is not None:
            await trio.aclose_forcefully(scrape)
    _say_stopped(peer, data_dir)


def _peer_config(
    manifest: Any,
    identity: Any,
    data_dir: Path,
    listen: list[str],
    boot: list[str],
    local_train: bool,
    cfg: NodeConfig,
    module: Any,
) -> Any:
    """The peer's configuration: the settings objects from `cfg` (`node.settings`); a role
    that trains locally pulls rollout bodies as a validator does."""
    from node import settings  # deferred: heavy import

    return settings.peer_config(
        cfg,
        manifest=manifest,
        identity=identity,
        data_dir=data_dir,
        listen=tuple(listen),
        bootstrap=tuple(boot),
        pull_bodies=module.PULLS_BODIES or local_train,
    )


async def _bind_metrics(metrics_at: tuple[str, int] | None) -> Any:
    """The metrics endpoint's TCP listener, or None without `--metrics`."""
    if metrics_at is None:
        return None
    try:
        [scrape] = (await trio.open_tcp_listeners(metrics_at[1], host=metrics_at[0]))[:1]
    except OSError as exc:
        raise CommandError(
            f"cannot serve metrics on {metrics_at[0]}:{metrics_at[1]}: {exc.strerror or exc}"
        ) from None
    return scrape


def _say_started(
    peer: Any,
    role: str,
    manifest: Any,
    data_dir: Path,
    boot: list[str],
    metrics_at: tuple[str, int] | None,
) -> None:
    """The start-up lines: peer id, run, listen addresses, bootstrap results, peers, and
    the metrics endpoint when one is served."""
    _say(f"swarm-node: peer {peer.host.peer_id}")
    _say(
        f"  role {role}, run {manifest.run_id!r} at policy version {peer.policy_version}, data {data_dir}"
    )
    for a in peer.host.listen_addrs():
        _say(f"  listening on {a}")
    note = loopback_note(peer.host.listen_addrs(), boot)
    if note is not None:
        _say(f"  note: {note}")
    if boot:
        ok = sum(1 for _, good, _ in peer.bootstrap_results if good)
        _say(f"  bootstrap: {ok}/{len(boot)} reached")
        for addr, good, err in peer.bootstrap_results:
            if not good:
                _say(f"  bootstrap FAILED {addr}: {err} (retrying with backoff)")
    _say(f"  peers reached: {len(peer.host.connected_peers())}")
    if metrics_at is not None:
        _say(f"  metrics at http://{metrics_at[0]}:{metrics_at[1]}/metrics")
        _say(f"  status page at http://{metrics_at[0]}:{metrics_at[1]}/")


def _status(peer: Any, io: RoleIO) -> dict[str, Any]:
    """What `status.json` and the metrics endpoint report now."""
    return {**peer.stats(), "role_status": io.status, "pid": os.getpid(), "time": time.time()}


async def _serve(
    peer: Any,
    module: Any,
    role_config: RoleConfig,
    io: RoleIO,
    data_dir: Path,
    scrape: Any,
    duration: float | None,
) -> None:
    """Run the role, `status.json` once a second and the metrics endpoint until SIGINT,
    SIGTERM or `duration` seconds."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, signals, io, nursery.cancel_scope)
            nursery.start_soon(_status_loop, peer, io, data_dir)
            if scrape is not None:
                history = History()
                nursery.start_soon(history.sample_forever, lambda: _status(peer, io))
                nursery.start_soon(metrics.serve, scrape, lambda: _status(peer, io), history)
            nursery.start_soon(module.run, peer, role_config, io)
            if duration is not None:
                await trio.sleep(duration)
                _say(f"swarm-node: --duration {duration:g} s reached: stopping")
                logging.getLogger("swarm.node").info("stopping: --duration reached")  # timestamped
                nursery.cancel_scope.cancel()


async def _stop_on_signal(signals: Any, io: RoleIO, scope: Any) -> None:
    """SIGUSR1: no new work from now on; SIGINT or SIGTERM: cancel `scope`."""
    async for sig in signals:
        if sig == signal.SIGUSR1:
            _say("swarm-node: SIGUSR1: no new work; still serving what we have")
            io.producing = False
            continue
        _say(f"swarm-node: {signal.Signals(sig).name}: stopping")
        scope.cancel()
        return


async def _status_loop(peer: Any, io: RoleIO, data_dir: Path) -> None:
    """Write `status.json` each second; a disk that refuses it (full, read-only) is one
    warning, retried with backoff (`node.disk_trouble`), and the node runs on."""
    trouble = DiskTrouble()
    log = logging.getLogger("swarm.node")
    while True:
        if trouble.ready(time.monotonic()):
            try:
                write_status(data_dir, _status(peer, io))
            except OSError as exc:
                if trouble.failed(time.monotonic()):
                    log.warning(
                        "cannot write %s: %s; retrying with backoff",
                        data_dir / STATUS_FILE,
                        exc.strerror or exc,
                    )
            else:
                if trouble.ok():
                    log.warning("status.json is written again")
        await trio.sleep(1.0)


def _say_stopped(peer: Any, data_dir: Path) -> None:
    left = peer.outbox.pending()
    with contextlib.suppress(Exception):  # stdout may be gone (a closed pipe)
        _say(
            f"swarm-node: published {peer.drained} queued messages while stopping"
            + (f" ({left} left unpublished: drain timed out)" if left else "")
        )
        _say(f"swarm-node: stopped cleanly ({data_dir})")
