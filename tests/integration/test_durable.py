"""Nothing lost when every worker goes: the job fails loudly without checkpoints, resumes from them with."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from cloud_elastic.status import query_status
from tests.integration.events_check import of, read_events
from tests.integration.harness import HostsFile, kill_job_workers, probe_cmd, processes_of_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _args(hosts: HostsFile, *extra: str) -> list[str]:
    return [
        "run", "-np", "2", "--min-np", "2", "--max-np", "2", "--host-discovery-script", str(hosts.script),
        "--discovery-interval", "0.2", "--host-missing-grace", "0.5", "--blacklist-cooldown-range", "300", "300",
        "--elastic-timeout", "60", *extra,
    ]


def _kill_everyone_and_replace(job, hosts: HostsFile) -> None:
    """Every worker SIGKILLed at once; new hosts appear in discovery."""
    hosts.set(["127.0.0.3", "127.0.0.4"])
    kill_job_workers(job.job_id())


def _freeze_and_read_the_commit_heard(job_id: str, runtime: Path) -> int:
    """SIGSTOP every worker and return the highest commit the driver heard of from them (its status)."""
    for pid in processes_of_job(job_id):
        os.kill(pid, signal.SIGSTOP)
    # A heartbeat sent just before the stop may still land: read until two answers a heartbeat apart agree.
    heard = None
    for _ in range(10):
        now = query_status(job_id, root=runtime / "cloud-elastic").commit_step
        if now == heard:
            return heard
        heard = now
        time.sleep(0.6)
    raise AssertionError(f"the driver's commit count of stopped workers kept changing (last {heard})")


def test_losing_every_worker_without_a_checkpoint_dir_fails_and_never_trains_from_scratch(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(_args(hosts, *probe_cmd("--steps", "400")))
    # The driver learns of commits from heartbeats (every 0.5 s); give it a few.
    job.wait_event("commit", rank=0, step=30)
    _kill_everyone_and_replace(job, hosts)
    assert job.finish() == 1, job.output()
    last = job.lines[-1]
    assert "training state" in last and "lost" in last and "--checkpoint-dir" in last, last
    assert "\n" not in last
    # No worker of the new hosts ever trained: nothing started over from initial weights.
    assert not [e for e in job.events if e.data.get("worker", "").startswith(("127.0.0.3", "127.0.0.4"))
                and e.kind in ("commit", "batch")]


def test_whole_group_loss_resumes_from_the_checkpoint_with_exactly_once_samples(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    ckpt = tmp_path / "ckpt"
    n = 160
    events_file = tmp_path / "events.jsonl"
    runtime = tmp_path / "run"
    runtime.mkdir()
    job = jobs(_args(hosts, "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "1",
                     "--events-file", str(events_file),
                     *probe_cmd("--sampler", str(n), "--epochs", "1", "--step-sleep", "0.1")),
               env={"XDG_RUNTIME_DIR": str(runtime)})
    job.wait_for(lambda j: "checkpoint of step" in j.output() and any(e["step"] >= 6 for e in j.of("commit")),
                 what="a checkpoint and some steps")
    heard = _freeze_and_read_the_commit_heard(job.job_id(), runtime)
    _kill_everyone_and_replace(job, hosts)
    assert job.finish() == 0, job.output()
    out = job.output()
    assert "resumed from the checkpoint of step" in out
    new = [e for e in job.events if e.data.get("worker", "").startswith(("127.0.0.3", "127.0.0.4"))]
    resumed_at = min(e["step"] for e in new if e.kind == "batch") - 1
    assert resumed_at >= 1, "the new workers started from step 0"  # the step counter continued
    # The checkpoint loaded is one the old workers had reached.
    old_batches = [e for e in job.events if e.kind == "batch" and e["worker"].startswith(("127.0.0.1", "127.0.0.2"))]
    assert resumed_at <= max(e["step"] for e in old_batches)
    # Exactly once from the checkpoint on: the old workers' batches up to the checkpoint's step,
    # then the new workers' batches, cover every index of the epoch exactly once.
    kept = [e for e in old_batches if e["step"] <= resumed_at] + [e for e in new if e.kind == "batch"]
    seen = Counter(i for e in kept for i in e["indices"])
    assert set(seen) == set(range(n)), f"missing {sorted(set(range(n)) - set(seen))[:10]}"
    assert max(seen.values()) == 1, f"twice: {[i for i, c in seen.items() if c > 1][:10]}"
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1
    # The events file records the checkpoints written and the one the resumed round loaded.
    records = read_events(events_file)
    saved = of(records, "checkpoint_saved")
    loaded = of(records, "checkpoint_loaded")
    assert saved and all(r["path"].startswith(str(ckpt)) and r["step"] >= 1 for r in saved), saved
    assert len(loaded) == 1 and loaded[0]["step"] == resumed_at, (loaded, resumed_at)
    assert loaded[0]["path"] in {r["path"] for r in saved}
    # The steps lost are counted and logged: what the driver heard the lost workers commit past the checkpoint.
    lost = max(0, heard - resumed_at)
    assert loaded[0]["steps_lost"] == lost, (loaded, heard)
    assert f"resumed from the checkpoint of step {resumed_at} ({loaded[0]['path']}); {lost} committed step(s) " \
           "after it were lost" in out
    [rollback] = [r for r in records if r["event"] == "rollback"]
    assert (rollback["commit_step"], rollback["steps_lost"]) == (resumed_at, lost), rollback
    [formed] = [r for r in records if r["event"] == "round_formed" and r.get("from_checkpoint")]
    assert formed["synced"] is True


def test_a_job_that_must_resume_without_a_usable_checkpoint_fails_instead_of_starting_over(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["run", "-np", "2", "-H", "127.0.0.1:2", "--checkpoint-dir", str(ckpt), *probe_cmd("--steps", "8")]
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    assert jobs(args, env=env).finish() == 0
    for data in ckpt.glob("ckpt-*/state.pt"):
        data.write_bytes(b"torn" + data.read_bytes()[4:])  # every checkpoint corrupt: its digest no longer matches
    again = jobs(args, env=env)
    assert again.finish() == 1, again.output()
    last = again.lines[-1]
    assert "training state lost: cannot resume from the checkpoint: no usable checkpoint in" in last, last
    assert not again.of("commit"), "a worker trained from its initial weights"


def test_a_checkpoint_dir_the_workers_see_apart_from_the_driver_ends_the_job_before_training_on(jobs, tmp_path):
    """memory:// is a store of each process's own, as a plain path is each host's own disk without a shared
    mount: the driver's job record is not there for rank 0, which ends the job at its first checkpoint."""
    url = "memory://ce-not-shared/ckpt"
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", url,
                *probe_cmd("--steps", "400")], env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert job.finish() == 1, job.output()  # before: 0, its checkpoints in rank 0's memory alone
    last = job.lines[-1]
    assert f"--checkpoint-dir {url} as this worker on 127.0.0.1 sees it holds no record of job {job.job_id()}: " \
           "the driver and every worker must see the same storage" in last, last
    assert "checkpoint of step" not in job.output() and len(job.of("commit")) < 400


def _events_of(path: Path, kind: str) -> bool:
    """Whether the events file (still being written) holds an event of ``kind`` yet."""
    import json

    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return False
    return any(json.loads(line).get("event") == kind for line in lines if line.endswith("}"))


def test_checkpoints_that_fail_after_one_was_written_are_events_and_the_job_trains_on(jobs, tmp_path):
    """A bucket policy changed on day 1 must not go unseen for days: each failed attempt is a checkpoint_failed
    event (and a metric), while the job, which has a checkpoint to go back to, trains on."""
    ck, aside, path, stop = tmp_path / "ck", tmp_path / "ck-aside", tmp_path / "events.jsonl", tmp_path / "stop"
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ck), "--checkpoint-interval", "0.5",
                "--events-file", str(path), *probe_cmd("--steps", "10", "--stop-when", str(stop))])
    job.wait_for(lambda j: _events_of(path, "checkpoint_saved"), 60, "a first checkpoint")
    ck.rename(aside)
    ck.write_text("")  # the storage now refuses every write (and the job record's read)
    job.wait_for(lambda j: _events_of(path, "checkpoint_failed"), 60, "a failed checkpoint attempt")
    ck.unlink()
    aside.rename(ck)  # the storage is back: the final checkpoint is written
    stop.touch()
    assert job.finish(timeout=90) == 0, job.output()
    failed = of(read_events(path), "checkpoint_failed")
    assert failed[0]["failed_in_a_row"] == 1 and failed[0]["reason"], failed
