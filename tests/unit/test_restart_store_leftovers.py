"""What a start finds in ``--checkpoint-dir`` besides the job record (review s57 rvB):

* another job's checkpoint folder copied in was resumed without a word (foreign.sh): copying one in is how users
  warm-start, so it is still resumed, but the start line names the job that wrote it;
* a succeeded job whose checkpoints AND ``job.json`` were gone was trained again from initial weights under a new
  job id, which then wrote its own ``succeeded.json`` over the record (gone.sh D): refused now, as a succeeded job
  whose checkpoints alone are gone is, with the remedies; so is one that only the drivers' claims name;
* a job whose checkpoint folders were all gone (deleted, moved, lost by storage) trained again from initial weights
  and said "succeeded" (session 70's audit): ``checkpointed.json`` says one was written, and the start is refused.
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


def _refusal(config: JobConfig, job_id: str) -> str:
    """The one-line ConfigError a start of ``config`` as ``job_id`` is refused with."""
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id=job_id)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def _job_j1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(config, store) of job j1, started on a fresh ``--checkpoint-dir``."""
    config = _config(tmp_path, monkeypatch)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    return config, store


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
    message = _refusal(config, "j2")
    assert message.startswith("job j1 succeeded at step 30 on "), message
    assert "which holds neither its checkpoints nor its job record (job.json) now: not training it again from " \
           "initial weights; use a fresh --checkpoint-dir, or remove " in message and "\n" not in message
    assert "/succeeded.json and " in message and message.endswith("/checkpointed.json to train a new job there"), \
        message
    assert not (ckpt / "job.json").exists() and (ckpt / "succeeded.json").read_bytes() == success

    (ckpt / "succeeded.json").unlink()  # the remedy: a new job trains there
    (ckpt / "checkpointed.json").unlink()
    plan = plan_start(config, open_store(config), job_id="j3")
    assert plan.job_id == "j3" and not plan.resumed


def test_a_job_the_drivers_claims_alone_name_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, monkeypatch)
    ckpt = tmp_path / "ckpt"
    plan_start(config, open_store(config), job_id="j1")
    assert plan_start(config, open_store(config), job_id="j2").generation == 1  # a restart: drivers/1.json
    (ckpt / "job.json").unlink()
    message = _refusal(config, "j3")
    assert message.startswith("job j1 ran on ") and "(driver generation 1), which holds neither" in message, message
    assert message.endswith(f"or remove {ckpt / 'drivers'} to train a new job there"), message
    assert not (ckpt / "job.json").exists()

    shutil.rmtree(ckpt / "drivers")
    assert plan_start(config, open_store(config), job_id="j4").job_id == "j4"


def test_a_success_that_names_no_step_without_its_job_record_still_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with its job record (test_restart_symlinked_checkpoints): nothing trained is on record."""
    from cloud_elastic.driver.restart.finished import mark_succeeded

    config, store = _job_j1(tmp_path, monkeypatch)
    mark_succeeded(store, "j1")
    (tmp_path / "ckpt" / "job.json").unlink()
    assert plan_start(config, open_store(config), job_id="j2").job_id == "j2"


@BACKENDS
def test_a_job_whose_checkpoint_folders_are_all_gone_is_not_trained_again_from_initial_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    """The audit's case: a job trained to step 128 and checkpointed; its folders went (a clean-up script, a bucket
    lifecycle rule, ``rm -rf ckpt-*``) and the same command started over from step 0, ending "succeeded"."""
    config, ckpt, _ = _finished_job(tmp_path, monkeypatch, scheme)
    (ckpt / "succeeded.json").unlink()  # not a finished job: one that was stopped, its checkpoints then lost
    for folder in ckpt.glob("ckpt-*"):
        shutil.rmtree(folder)
    message = _refusal(config, "j2")
    assert message.startswith("job j1 wrote a checkpoint of step 30 (ckpt-"), message
    assert "which holds no checkpoint now: not training it again from initial weights; put its checkpoint folders " \
           "back, use a fresh --checkpoint-dir, or remove " in message and "\n" not in message
    assert message.endswith("checkpointed.json to train it from the start there"), message

    (ckpt / "job.json").unlink()  # and the job record too: refused as well, the record naming the job
    with pytest.raises(ConfigError, match=r"^job j1 wrote a checkpoint of step 30 \(ckpt-.*which holds neither its "
                                          r"checkpoints nor its job record"):
        plan_start(config, open_store(config), job_id="j3")

    (ckpt / "checkpointed.json").unlink()  # the remedy, a deliberate act: a new job trains there
    shutil.rmtree(ckpt / "drivers", ignore_errors=True)
    assert plan_start(config, open_store(config), job_id="j4").job_id == "j4"


def test_each_checkpoint_written_is_recorded_and_a_record_that_cannot_be_read_still_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    config, store = _job_j1(tmp_path, monkeypatch)
    first = store.save(10, {"step": 10}, {"job_id": "j1"})
    newest = store.save(20, {"step": 20}, {"job_id": "j1"})
    record = json.loads((tmp_path / "ckpt" / "checkpointed.json").read_bytes())
    assert (record["job_id"], record["step"], record["name"]) == ("j1", 20, newest.name) and first.name != newest.name
    for folder in (tmp_path / "ckpt").glob("ckpt-*"):
        shutil.rmtree(folder)
    (tmp_path / "ckpt" / "checkpointed.json").write_text("{not json")  # torn or tampered with: still a record
    with pytest.raises(ConfigError, match=r"^job j1 wrote a checkpoint \(its record cannot be read: "):
        plan_start(config, open_store(config), job_id="j2")


def test_a_job_whose_newest_checkpoint_folder_is_gone_does_not_go_back_to_an_older_one_unasked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Review h25: the newest folder deleted, an older one kept: the restart resumed the older one, said it "cannot
    say how many" steps were lost (``checkpointed.json`` said), and succeeded. Refused, with the way to go back."""
    config, store = _job_j1(tmp_path, monkeypatch)
    store.save(21, {"step": 21}, {"job_id": "j1"})
    newest = store.save(31, {"step": 31}, {"job_id": "j1"})
    shutil.rmtree(tmp_path / "ckpt" / newest.name)
    message = _refusal(config, "j2")
    assert message == (f"job j1 wrote a checkpoint of step 31 ({newest.name}) to {store.url}, which is gone now; the "
                       f"newest there is of step 21: not going back to it unasked; put that checkpoint folder back, or "
                       f"remove {store.backend.url('checkpointed.json')} to resume from step 21"), message
    (tmp_path / "ckpt" / "checkpointed.json").unlink()  # the remedy: going back is asked for
    with caplog.at_level(logging.WARNING):
        plan = plan_start(config, open_store(config), job_id="j2")
    assert plan.job_id == "j1" and plan.resumed and "the latest checkpoint is of step 21" in caplog.text


def test_a_newest_checkpoint_that_is_there_but_unreadable_keeps_the_stores_own_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not "gone": the store skips it with a WARNING naming it and why, as it always did (CheckpointStore.latest).
    config, store = _job_j1(tmp_path, monkeypatch)
    store.save(21, {"step": 21}, {"job_id": "j1"})
    newest = store.save(31, {"step": 31}, {"job_id": "j1"})
    (tmp_path / "ckpt" / newest.name / "manifest.json").write_text("{torn")
    plan = plan_start(config, open_store(config), job_id="j2")
    assert plan.job_id == "j1" and plan.resumed


def test_a_checkpoint_published_while_the_start_looked_is_no_gone_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review h27: a dead driver's workers train on under --driver-grace and may publish a checkpoint between the
    start's listing and its read of ``checkpointed.json``: that one is not gone, and the start goes on."""
    from cloud_elastic.driver.restart.stored import list_checkpoints

    config, store = _job_j1(tmp_path, monkeypatch)
    store.save(21, {"step": 21}, {"job_id": "j1"})
    real_list, calls = store.list, []

    def listed_before_the_publish():
        calls.append(1)
        found = real_list()
        return found[1:] if len(calls) == 1 else found  # the first listing ran just before step 31's publish

    store.save(31, {"step": 31}, {"job_id": "j1"})
    monkeypatch.setattr(store, "list", listed_before_the_publish)
    assert [c.step for c in list_checkpoints(store, "j1")] == [21] and len(calls) == 2  # looked again: no refusal
