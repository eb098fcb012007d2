"""run_elastic on a real local Spark: Spark tasks, real worker processes, Gloo between them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.ray.conftest import load_example, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _progress(directory: Path) -> list[dict]:
    rows = []
    for path in directory.glob("*"):
        if path.suffix != ".tmp":
            try:
                rows.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass  # being replaced right now
    return rows


def _round_of(directory: Path, size: int, after_step: int = 0, exclude_pids: frozenset = frozenset()):
    rows = [r for r in _progress(directory)
            if r["size"] == size and r["step"] > after_step and r["pid"] not in exclude_pids]
    return rows if len(rows) == size else None


def test_a_killed_worker_shrinks_the_job_and_spark_retrying_its_task_brings_it_back(spark, tmp_path):
    from cloud_elastic.spark import run_elastic

    progress = tmp_path / "progress"
    progress.mkdir()
    stop = tmp_path / "stop"
    example = load_example("pyspark")
    outcome: dict = {}

    def go() -> None:
        try:
            outcome["results"] = run_elastic(
                example.train, kwargs={"steps": 5, "step_sleep": 0.05, "stop_file": str(stop),
                                       "progress_dir": str(progress)},
                num_proc=2, min_np=1, max_np=2,
            )
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    both = wait_for(lambda: _round_of(progress, 2), 120, "two workers training together")
    victim = max(both, key=lambda r: r["rank"])
    os.kill(victim["pid"], signal.SIGKILL)
    survivor = wait_for(lambda: _round_of(progress, 1, max(r["step"] for r in both), frozenset({victim["pid"]})),
                        120, "the survivor training alone")
    wait_for(lambda: _round_of(progress, 2, survivor[0]["step"], frozenset({victim["pid"]})), 120,
             "the retried task's worker training with the survivor")
    stop.touch()
    thread.join(120)
    assert not thread.is_alive(), "run_elastic did not return"
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results


def _broken() -> None:
    import cloud_elastic.torch as hvd

    hvd.init()
    raise ValueError(f"bad batch on rank {hvd.rank()}")


def test_a_failing_training_function_fails_the_job_with_its_error(spark):
    from cloud_elastic.errors import JobFailed
    from cloud_elastic.spark import run_elastic

    with pytest.raises(JobFailed, match=r"the training function raised: ValueError: bad batch on rank \d"):
        run_elastic(_broken, num_proc=2, min_np=2, max_np=2)


def test_tasks_still_queued_when_training_ends_exit_at_once_and_the_job_returns(spark, caplog):
    from cloud_elastic.spark import run_elastic

    # local[2,4] runs two tasks at once: of max_np=4, two are still queued when training ends.
    caplog.set_level("INFO", logger="cloud_elastic.spark")
    example = load_example("pyspark")
    results = run_elastic(example.train, kwargs={"steps": 10}, num_proc=2, min_np=2, max_np=4)
    returned = time.time()
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["step"] == 10 for r in results), results
    assert len({r["checksum"] for r in results}) == 1, results
    # Tasks 2 and 3 start once training tasks end. One may register just before the driver marks the
    # end (its worker exited a moment earlier); it then hears "exit" on its first poll instead.
    late = [r for r in caplog.records if str(r.msg).startswith("job %s: spark task %d (attempt %d) ")
            and r.args[1] in (2, 3)]
    assert sorted(r.args[1] for r in late) == [2, 3], [r.getMessage() for r in caplog.records]
    # They ended by themselves: nothing waited out the 30 s before Spark is told to cancel them.
    assert not any("cancelling them" in r.getMessage() for r in caplog.records)
    assert returned - max(r.created for r in late) < 10.0


def _note_load(path: str) -> dict:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return {}


class _NotesWhereLoaded:
    """A value that, when unpickled, notes the process it is unpickled in (and becomes an empty dict)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_note_load, (self.path,))


def train_return_slowly_and_note_where_loaded(example, steps: int, loads: str) -> dict:
    from tests.ray.test_slow_return import train_and_return_slowly

    result = train_and_return_slowly(example, steps)
    result["loaded"] = _NotesWhereLoaded(loads)
    return result


def test_a_return_value_slower_to_pickle_than_the_heartbeat_timeout_comes_back_unpickled_once_here(spark, tmp_path):
    # The worker keeps heartbeating while its value is pickled for the task (a large state_dict): see
    # tests/ray/test_slow_return.py. In this module to share its Spark session (one more took 9 s to start).
    # The value is unpickled once, in this process: a task that loaded it (a large state_dict: minutes) before
    # handing it to Spark, which pickled it again, made its stage outlast training by twice that.
    from cloud_elastic.spark import run_elastic
    from tests.ray.test_slow_return import HEARTBEAT_TIMEOUT_S

    loads = tmp_path / "loads"
    results = run_elastic(train_return_slowly_and_note_where_loaded,
                          kwargs={"example": load_example("pyspark"), "steps": 4, "loads": str(loads)},
                          num_proc=1, min_np=1, max_np=1, heartbeat_timeout=HEARTBEAT_TIMEOUT_S)
    assert [(r["rank"], r["step"], r["blob"], r["loaded"]) for r in results] == [(0, 4, {}, {})]
    assert loads.read_text().split() == [str(os.getpid())], "the value was unpickled elsewhere than in run_elastic"


def test_results_come_back_in_rank_order_with_identical_replicas_the_same_model_as_under_cloud_elastic_run(
        spark, capsys, monkeypatch):
    # examples/elastic_anywhere.py's own main(), as `python examples/elastic_anywhere.py --spark ...` runs it; its
    # getOrCreate() finds this module's session (a Spark of its own cost a JVM start: 33 s in CI, against 10 s).
    # main() calls run_elastic(train, kwargs={"steps": 10}, num_proc=2, min_np=2, max_np=2) and prints what it
    # returns in that order: the job of a test of its own before (two more workers, each a fresh interpreter
    # importing torch: 9 CPU-s).
    from tests.ray.test_example_everywhere import same_training, under_run_results

    reference = under_run_results()
    capsys.readouterr()
    example = load_example("pyspark")
    monkeypatch.setattr("sys.argv", ["elastic_anywhere.py", "--spark", "local[2]", "--steps", "10",
                                     "--min-np", "2", "--max-np", "2"])
    example.main()
    on_spark = [json.loads(line.split("RESULT ", 1)[1]) for line in capsys.readouterr().out.splitlines()
                if line.startswith("RESULT ")]
    assert [r["rank"] for r in on_spark] == [0, 1], on_spark
    same_training(on_spark, 2)  # the size, the steps and one checksum on every rank
    assert on_spark[0]["checksum"] == reference[0]["checksum"]
