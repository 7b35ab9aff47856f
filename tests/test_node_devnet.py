"""`swarm-node devnet` end to end: real node processes, a small (untrained) model, a report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.commands import devnet
from node.run_file import manifest_from_table, manifest_to_toml
from tests.support.devnet_model import small_run_file
from trainer.tiny_policy import run_manifest_table

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_run_file(tmp_path_factory.mktemp("devnet-model"), "devnet-test", 24)


def test_devnet_runs_workers_validator_trainer_and_writes_a_report(
    small_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    report = devnet.main(
        inference=2,
        validators=1,
        duration=30,
        out=out,
        run=small_run,
        audit_fraction=1.0,
        batch_size=2,
        live=True,
        publish_every=8.0,
    )  # live, but stderr is not a terminal here: plain progress lines
    err = capsys.readouterr().err
    assert "devnet   10/30 s:" in err and "audits: " in err and " sampled, " in err, err[-3000:]
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["totals"] == report["totals"]
    totals = report["totals"]
    assert totals["produced"] > 0, report
    assert totals["trainer_bodies"] > 0, report
    # workers pause (still serving) and the trainer catches up before the stop
    assert report["delivery_to_trainer"] >= 0.95, report["totals"]
    assert totals["audited"] > 0, report
    assert totals["audits_failed"] == 0, report  # honest workers pass their audits
    # the audit backlog is bounded and reported
    assert (
        0 < totals["audit_queue_capacity"]
        and totals["audit_queued"] <= totals["audit_queue_capacity"]
    ), totals
    assert "still queued when the swarm stopped (queue bound " in err, err[-3000:]
    # every penalty is listed with its reason, and none is against an honest (devnet) node
    assert "devnet: penalties: " in err, err[-3000:]
    honest = [g for g in report["penalties"] if g["honest"]]
    assert honest == [], honest
    # The trainer published versions; the first reached every worker, and rollouts made
    # with a published version passed audits run with that version's weights.
    first = report["versions"][0]
    assert first["version"] == 1 and first["workers_reached"] == 2, report["versions"]
    val = next(n for n in report["nodes"] if n["role"] == "validator")["status"]["role_status"]
    assert sum(n for k, n in val.items() if k.startswith("audited_v") and k != "audited_v0") > 0, (
        val
    )
    roles = sorted(n["role"] for n in report["nodes"])
    assert roles == ["inference", "inference", "trainer", "validator"]
    assert all(n["exit_code"] == 0 for n in report["nodes"]), [
        (n["name"], n["exit_code"]) for n in report["nodes"]
    ]
    assert report["series"] and report["series"][-1]["produced"] <= totals["produced"]
    assert report["learning"]["series"] == []  # the publishing drill does not train
    assert report["learning"]["final"] == {"skipped": "the trainer saved no version"}
    # what became of every produced rollout, each counted once
    fates = report["fates"]
    assert (
        "error" not in fates
        and sum(fates["counts"].values()) == fates["produced"] == totals["produced"]
    ), fates
    assert "devnet: of " in err and " rollouts produced: " in err, err[-3000:]
    for plot in report["plots"]:
        assert (out / plot).stat().st_size > 1000
    for n in report["nodes"]:
        assert (out / n["log"]).exists()
        log = (out / n["log"]).read_text()
        assert "stopped cleanly" in log
        assert "Traceback" not in log, f"{n['name']}: {log[log.find('Traceback') :][:2000]}"


def test_a_training_devnet_scores_its_last_version_against_the_warm_start(
    small_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from node.commands import devnet_evaluation

    table = run_manifest_table(run_id="devnet-train-test", seed=3)
    table["run"]["model"] = str(small_run.parent / "model")
    table["sampling"]["max_new_tokens"] = 24
    table["rl"] = {"lr": 5e-5, "groups_per_step": 2, "publish_every": 4}  # versions within seconds
    run = tmp_path / "run.toml"
    run.write_text(manifest_to_toml(manifest_from_table(table)))
    out = tmp_path / "report"
    report = devnet.main(
        inference=2,
        validators=1,
        duration=30,
        out=out,
        run=run,
        batch_size=2,
        audit_fraction=1.0,
        live=False,
        eval_tasks=48,
    )
    err = capsys.readouterr().err
    final = report["learning"]["final"]
    published = max(v["version"] for v in report["versions"])
    # the trainer's last saved version: the last it published, or one it saved as the stop came
    assert published >= 1 and published <= final["version"] <= published + 1, (
        final,
        report["versions"],
    )
    assert (
        final["tasks"] == 48 and final["samples_per_task"] == devnet_evaluation.FINAL_EVAL_SAMPLES
    ), final
    low, high = final["gain_ci95"]
    assert low <= final["gain"] <= high, final
    assert (
        abs(final["gain"] - (final["final_solve_rate"] - final["warm_start_solve_rate"])) <= 2e-4
    ), final
    assert "devnet: final evaluation (48 held-out tasks x 2 samples)" in err, err[-3000:]
    assert f"-> version {final['version']} " in err, err[-3000:]
    assert json.loads((out / "report.json").read_text())["learning"]["final"] == final
    assert (out / "learning.png").stat().st_size > 1000
