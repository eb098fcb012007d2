"""What a restarted driver says of the checkpoint it finds (cloud_elastic.driver.restart.stored.resumes): adopting
its predecessor's running workers, training does not go back to that checkpoint, so no WARNING says it resumes
from it (review s60 rvS finding 4); a driver that does resume from it still warns."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from tests.unit.test_start_plan import _config, _dead_driver

pytestmark = pytest.mark.timeout(60)


def _start(tmp_path, monkeypatch, caplog, *, adoptable: bool, saved: bool = True):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    config = _config(ckpt)
    store = open_store(config)
    plan_start(config, store, job_id="a1b2c3d4")  # the first driver records the job
    if saved:
        store.save(1, {"step": 1}, {"job_id": "a1b2c3d4"})
    _dead_driver(tmp_path, "a1b2c3d4", ckpt, workers=adoptable)  # killed; its workers train on, or none is left
    caplog.clear()
    with caplog.at_level(logging.INFO):
        plan = plan_start(config, open_store(config), job_id="mine")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "checkpoint" in r.getMessage()]
    return plan, lines


def test_an_adopting_driver_calls_the_checkpoint_the_fallback_at_info_not_a_resume_warning(
        tmp_path, monkeypatch, caplog) -> None:
    plan, lines = _start(tmp_path, monkeypatch, caplog, adoptable=True)
    assert plan.adopt is not None and plan.resumed  # the checkpoint is still there to go back to
    assert not [line for level, line in lines if "resuming from" in line], lines
    [(level, line)] = [(level, line) for level, line in lines if "fallback" in line]
    assert level == logging.INFO and "\n" not in line
    assert "adopting the running workers; the latest checkpoint in" in line and "of step 1 written" in line
    assert line.endswith("is only the fallback should the adoption fail"), line


def test_a_driver_that_resumes_from_the_checkpoint_still_warns_of_its_step(tmp_path, monkeypatch, caplog) -> None:
    plan, lines = _start(tmp_path, monkeypatch, caplog, adoptable=False)
    assert plan.adopt is None and plan.resumed
    [(level, line)] = [(level, line) for level, line in lines if "resuming from" in line]
    assert level == logging.WARNING and "the latest checkpoint is of step 1, written " in line
    assert not [line for _, line in lines if "fallback" in line], lines


def test_an_adopting_driver_with_no_checkpoint_yet_does_not_say_training_starts_over(tmp_path, monkeypatch,
                                                                                      caplog) -> None:
    # Review s60 rvV: the workers it adopts train on from their own step; only a failed adoption starts over.
    plan, lines = _start(tmp_path, monkeypatch, caplog, adoptable=True, saved=False)
    assert plan.adopt is not None and not plan.resumed
    assert not [line for _, line in lines if "training starts over" in line], lines
    [(level, line)] = lines
    assert level == logging.INFO and "adopting the running workers; there is no checkpoint in" in line
    assert line.endswith("so only an adoption that fails would start training over"), line
