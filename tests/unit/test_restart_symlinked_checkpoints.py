"""A restart never trains from initial weights over a job's trained state.

The review's symlinked.sh moved a finished job's checkpoint folders to another volume and symlinked them back
under their names. The store never follows a link (a link could point at another job's folder, which pruning
would then delete), so it listed none, and the restart said "already succeeded ... at step 30", then "it has no
checkpoint yet, so training starts over", trained from step 0 and reported success. A checkpoint-named link is
now counted as unreadable and the start is refused in one line naming it; and a job whose success record names a
step never starts over when its checkpoints are gone (moved, deleted), by either backend.

The review's sym_variants.sh (rv8): with job.json gone too, the refusal said "holds checkpoints but no job record
... restore job.json", not a word of the links; and a refused start first said "already succeeded ... resuming it".
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.finished import mark_succeeded
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

BACKENDS = pytest.mark.parametrize("scheme", ["", "local://"], ids=["local", "fsspec"])


def _finished_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> tuple[JobConfig, Path, list[str]]:
    """A job that checkpointed steps 10, 20 and 30 and succeeded: its config, directory and checkpoint urls."""
    import fsspec.config

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    # fsspec's local filesystem makes no folders unless told to; object stores have none to make.
    monkeypatch.setitem(fsspec.config.conf, "local", {"auto_mkdir": True})
    ckpt = tmp_path / "ckpt"
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2,
                       checkpoint_dir=scheme + str(ckpt), checkpoint_keep=3)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    urls = [store.save(step, {"step": step}, {"job_id": "j1"}).url for step in (10, 20, 30)]
    mark_succeeded(store, "j1")
    return config, ckpt, urls


@BACKENDS
@pytest.mark.parametrize("moved", ["all", "newest"])
def test_a_restart_over_checkpoint_folders_that_are_symbolic_links_is_refused_naming_the_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, moved: str) -> None:
    config, ckpt, urls = _finished_job(tmp_path, monkeypatch, scheme)
    other = tmp_path / "other-volume"
    other.mkdir()
    folders = sorted(ckpt.glob("ckpt-*"))
    _link_away(folders if moved == "all" else folders[-1:], other)
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="j2")
    message = str(refused.value)
    assert f"{urls[-1]} is a symbolic link, never followed: move the folder back" in message, message
    assert "\n" not in message
    assert all((other / f.name / "manifest.json").exists() for f in folders if f.is_symlink())  # nothing deleted
    shutil.rmtree(other / folders[-1].name)
    folders[-1].unlink()  # the newest gone for good, not a link any more: not gone back from unasked (review h25)
    if moved == "newest":
        with pytest.raises(ConfigError, match=r"which is gone now; the newest there is of step 20"):
            plan_start(config, open_store(config), job_id="j3")
        (ckpt / "checkpointed.json").unlink()  # asked: the job resumes from step 20
        assert plan_start(config, open_store(config), job_id="j3").resumed


def _link_away(folders: list[Path], other: Path) -> None:
    for folder in folders:
        folder.rename(other / folder.name)
        folder.symlink_to(other / folder.name, target_is_directory=True)


@BACKENDS
def test_symlinked_checkpoints_without_their_job_record_are_refused_naming_the_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    config, ckpt, urls = _finished_job(tmp_path, monkeypatch, scheme)
    other = tmp_path / "other-volume"
    other.mkdir()
    _link_away(sorted(ckpt.glob("ckpt-*")), other)
    (ckpt / "job.json").unlink()
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="j2")
    message = str(refused.value)
    assert f"{urls[-1]} is a symbolic link, never followed: move the folder back" in message, message
    assert "\n" not in message and not (ckpt / "job.json").exists()


@pytest.mark.parametrize("gone", ["linked", "deleted"])
def test_a_refused_start_of_a_succeeded_job_never_says_it_resumes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, gone: str) -> None:
    config, ckpt, _ = _finished_job(tmp_path, monkeypatch, "")
    folders = sorted(ckpt.glob("ckpt-*"))
    if gone == "linked":
        (tmp_path / "other-volume").mkdir()
        _link_away(folders, tmp_path / "other-volume")
    else:
        for folder in folders:
            shutil.rmtree(folder)
    with caplog.at_level(logging.INFO), pytest.raises(ConfigError):
        plan_start(config, open_store(config), job_id="j2")
    assert "resuming it" not in caplog.text, caplog.text


def test_a_resumed_succeeded_job_is_still_said_to_have_succeeded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    config, _, _ = _finished_job(tmp_path, monkeypatch, "")
    with caplog.at_level(logging.INFO):
        assert plan_start(config, open_store(config), job_id="j2").resumed
    said = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(said) if "already succeeded" in m and "at step 30; resuming it" in m)
    assert any("resuming from" in m for m in said[first + 1:]), said


@BACKENDS
def test_a_succeeded_job_whose_checkpoints_are_gone_is_refused_rather_than_trained_from_initial_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    config, ckpt, _ = _finished_job(tmp_path, monkeypatch, scheme)
    for folder in ckpt.glob("ckpt-*"):
        shutil.rmtree(folder)
    with pytest.raises(ConfigError) as refused:
        plan_start(config, open_store(config), job_id="j2")
    message = str(refused.value)
    assert message.startswith("job j1 succeeded at step 30 on ") and "holds no checkpoint now" in message, message
    assert "not training it again from initial weights" in message and "\n" not in message


def test_a_succeeded_job_that_never_checkpointed_still_starts(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Its success record names no step: nothing trained is on record, so the start goes on as before."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2,
                       checkpoint_dir=str(tmp_path / "ckpt"))
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    mark_succeeded(store, "j1")
    plan = plan_start(config, open_store(config), job_id="j2")
    assert plan.job_id == "j1" and not plan.resumed
