"""What a start finds in ``--checkpoint-dir`` besides the job record (review s57 rvB):

* another job's checkpoint folder copied in was resumed without a word (foreign.sh): copying one in is how users
  warm-start, so it is still resumed, but the start line names the job that wrote it;
* a succeeded job whose checkpoints AND ``job.json`` were gone was trained again from initial weights under a new
  job id, which then wrote its own ``succeeded.json`` over the record (gone.sh D): refused now, as a succeeded job
  whose checkpoints alone are gone is, with the remedies; so is one that only the drivers' claims name.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.errors import ConfigError
from tests.unit.test_restart_symlinked_checkpoints import BACKENDS, _finished_job

pytestmark = pytest.mark.timeout(60)


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobConfig:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2,
                     checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_keep=3)


def test_a_checkpoint_copied_in_from_another_job_is_resumed_and_the_start_line_names_its_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    config = _config(tmp_path, monkeypatch)
    store = open_store(config)
    plan_start(config, store, job_id="dc58994d")
    store.save(20, {"step": 20}, {"job_id": "dc58994d"})
    with caplog.at_level(logging.INFO):
        assert plan_start(config, open_store(config), job_id="j2").resumed
    [line] = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert "the latest checkpoint is of step 20" in line and " by job" not in line, line

    store.save(40, {"step": 40}, {"job_id": "6a524de8"})  # the manifest of a folder copied from job 6a524de8's
    caplog.clear()
    with caplog.at_level(logging.INFO):
        plan = plan_start(config, open_store(config), job_id="j3")
    assert plan.resumed and plan.job_id == "dc58994d"
    [line] = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert "the latest checkpoint is of step 40, written " in line and "\n" not in line, line
    assert line.endswith(" ago by job 6a524de8 (not this job's dc58994d: a copied checkpoint)"), line


@BACKENDS
def test_a_succeeded_job_whose_checkpoints_and_job_record_are_gone_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    config, ckpt, _ = _finished_job(tmp_path, monkeypatch, scheme)
    for folder in ckpt.glob("ckpt-*"):
        shutil.rmtree(folder)
    (ckpt / "job.json").unlink()
    success = (ckpt / "succeeded.json").read_bytes()
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="j2")
    message = str(refused.value)
    assert message.startswith("job j1 succeeded at step 30 on "), message
    assert "which holds neither its checkpoints nor its job record (job.json) now: not training it again from " \
           "initial weights; use a fresh --checkpoint-dir, or remove " in message and "\n" not in message
    assert message.endswith("succeeded.json to train a new job there"), message
    assert not (ckpt / "job.json").exists() and (ckpt / "succeeded.json").read_bytes() == success

    (ckpt / "succeeded.json").unlink()  # the remedy: a new job trains there
    plan = plan_start(config, open_store(config), job_id="j3")
    assert plan.job_id == "j3" and not plan.resumed


def test_a_job_the_drivers_claims_alone_name_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, monkeypatch)
    ckpt = tmp_path / "ckpt"
    plan_start(config, open_store(config), job_id="j1")
    assert plan_start(config, open_store(config), job_id="j2").generation == 1  # a restart: drivers/1.json
    (ckpt / "job.json").unlink()
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="j3")
    message = str(refused.value)
    assert message.startswith("job j1 ran on ") and "(driver generation 1), which holds neither" in message, message
    assert message.endswith(f"or remove {ckpt / 'drivers'} to train a new job there"), message
    assert not (ckpt / "job.json").exists()

    shutil.rmtree(ckpt / "drivers")
    assert plan_start(config, open_store(config), job_id="j4").job_id == "j4"


def test_a_success_that_names_no_step_without_its_job_record_still_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with its job record (test_restart_symlinked_checkpoints): nothing trained is on record."""
    from cloud_elastic.driver.restart.finished import mark_succeeded

    config = _config(tmp_path, monkeypatch)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    mark_succeeded(store, "j1")
    (tmp_path / "ckpt" / "job.json").unlink()
    assert plan_start(config, open_store(config), job_id="j2").job_id == "j2"
