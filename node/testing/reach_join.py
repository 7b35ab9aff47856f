"""A worker of the full role stack joining a public run from behind NAT, timed: for
`bench reach` (`join_s` of the full-stack worker) and `tests/test_node_join_nat.py`.

`FullStack(lab, tmp)` runs real `swarm-node start` processes on an emulated network
(`node.testing.netlab`): a relay (the bootstrap peer), a trainer and a validator on the public
side, sharing one signed run of a small untrained policy (`small_run`). `join(ns)` starts
`swarm-node start --role inference --join <relay> --authority <id>` in namespace `ns` and
returns the seconds from that start to the validator's first passed audit (the validator
audits every rollout, and this worker is the only producer). `close()` stops every node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from node.keyfile import write_key
from node.model_fetch import read_bundle_files
from node.run_file import load_run_manifest, manifest_from_table, manifest_to_toml
from node.testing.netlab import PUBLIC_IP, NetLab
from protocol.content_id import content_id
from protocol.identity import Identity
from protocol.model_bundle import encode_bundle
from trainer.checkpoint import from_model_dir
from trainer.model_dir import save_model_dir
from trainer.tiny_policy import build_model, build_tokenizer, run_manifest_table

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the processes run from there
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def small_run(root: Path, run_id: str = "reach-join", max_new_tokens: int = 24) -> Path:
    """A run manifest (unsigned) of a small untrained policy saved under `root`:
    `root/model/` and `root/run.toml` (returned)."""

    tok = build_tokenizer(seed=0)
    model = build_model(
        tok,
        seed=2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    table = run_manifest_table(run_id=run_id, seed=3)
    table["run"]["model"] = str(save_model_dir(model, tok, root / "model"))
    table["sampling"]["max_new_tokens"] = max_new_tokens
    run = root / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    return run


def read_status(data_dir: Path) -> dict[str, Any]:
    """A node's status file, {} while it has none."""
    try:
        return json.loads((data_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


class FullStack:
    """Public relay + trainer + validator of one signed run; workers join from NATs."""

    def __init__(
        self, lab: NetLab, tmp: Path, template: Path | None = None, fresh_joiner: bool = False
    ) -> None:
        """`fresh_joiner`: the run names the built-in model but pins the small one (the
        public nodes are given its directory with `--model`), and a joiner sees an empty
        data root, as on a fresh machine: it must fetch the model from the run."""
        self.lab, self.tmp = lab, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ids: dict[str, str] = {}
        keys = {n: Identity.generate() for n in ("authority", "relay", "trainer", "validator")}
        for name, key in keys.items():
            write_key(tmp / f"{name}.key", key)
            self.ids[name] = key.peer_id_b58
        manifest = dataclasses.replace(
            load_run_manifest(template or small_run(tmp)),
            validator_keys=(keys["validator"].peer_id,),
            trainer_keys=(keys["trainer"].peer_id,),
        )
        self.model_args: tuple[str, ...] = ()
        self.joiner_env: dict[str, str] = {}
        if fresh_joiner:
            model_dir = Path(manifest.model)
            manifest = dataclasses.replace(
                manifest,
                model="builtin:tiny",
                model_digest=content_id(from_model_dir(model_dir)),
                model_files_digest=content_id(encode_bundle(read_bundle_files(model_dir))),
            )
            self.model_args = ("--model", str(model_dir))
            self.joiner_env = {"SWARM_NODE_DATA": str(tmp / "fresh-machine")}
        self.run = tmp / "signed-run.toml"
        self.run.write_text(manifest_to_toml(manifest))
        self._cli(
            "run", "sign", str(self.run), "--key", str(tmp / "authority.key"), "--version", "1"
        )
        self.relay_addr = f"/ip4/{PUBLIC_IP}/tcp/4001/p2p/{self.ids['relay']}"

    def _cli(self, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "node.cli", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"swarm-node {args[0]}: {done.stderr.strip()}")

    def _start(
        self,
        ns: str,
        name: str,
        role: str,
        listen: str,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        try:
            self.procs[name] = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "node.cli",
                    "start",
                    "--role",
                    role,
                    "--key",
                    str(self.tmp / f"{name}.key"),
                    "--data-dir",
                    str(self.tmp / name),
                    "--listen",
                    listen,
                    "--duration",
                    "600",
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        finally:
            log.close()

    def _wait(self, name: str, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if status := read_status(self.tmp / name):
                return status
            self._check_alive()
            time.sleep(0.2)
        raise TimeoutError(f"{name} wrote no status within {timeout:g} s: {self.log_tail(name)}")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 2000) -> str:
        """The last `chars` characters of node `name`'s log (empty when it has none)."""
        try:
            return (self.tmp / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start_public(self) -> None:
        """The relay, then the trainer and the validator bootstrapping from it."""
        self._start(
            self.lab.wan, "relay", "relay", f"/ip4/{PUBLIC_IP}/tcp/4001", "--run", str(self.run)
        )
        self._wait("relay")
        boot = ("--run", str(self.run), "--bootstrap", self.relay_addr, *self.model_args)
        self._start(self.lab.wan, "trainer", "trainer", f"/ip4/{PUBLIC_IP}/tcp/4002", *boot)
        self._start(
            self.lab.wan,
            "validator",
            "validator",
            f"/ip4/{PUBLIC_IP}/tcp/4003",
            *boot,
            "--audit-fraction",
            "1.0",
            "--batch-size",
            "2",
        )
        self._wait("trainer")
        self._wait("validator")

    def join(self, ns: str, name: str = "worker", timeout: float = START_TIMEOUT_S) -> float:
        """Seconds from `start --join` of a worker in `ns` to the validator's first passed audit."""

        key = Identity.generate()
        write_key(self.tmp / f"{name}.key", key)
        self.ids[name] = key.peer_id_b58
        started = time.monotonic()
        self._start(
            ns,
            name,
            "inference",
            f"/ip4/{self.lab.host_ip(ns)}/tcp/4100",
            "--join",
            self.relay_addr,
            "--authority",
            self.ids["authority"],
            "--batch-size",
            "2",
            env=self.joiner_env,
        )
        while time.monotonic() - started < timeout:
            if self.validator_counts().get("passed", 0) > 0:
                return time.monotonic() - started
            self._check_alive()
            time.sleep(0.25)
        raise TimeoutError(
            f"no rollout of {name} accepted within {timeout:g} s: {self.log_tail(name)}"
        )

    def validator_counts(self) -> dict[str, Any]:
        """The validator's role status, read from its status file."""
        return read_status(self.tmp / "validator").get("role_status", {})

    def close(self) -> None:
        """Stop every node: terminate, then kill one not gone after `STOP_TIMEOUT_S`."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
