"""Follow-mode admission, end to end (``worker/commit/follow.py``): a newcomer joins a running job of two as a
follower, receives the committed state a few hundred bytes per commit while the job trains on, and becomes a
full member at a later commit.

What a user sees: the job never stops or rolls back; at the end of the window every worker enters the training
function again with the same parameters, optimizer state and BatchNorm buffers (one checksum), and ends with them;
a metric averaged in the loop during the window is the running workers' average, the follower's value left out;
a holder or the follower killed during the window costs what any failure costs (the survivors go back to their
commits, nothing starts from initial weights) and the job finishes with one state; an optimizer nobody can follow
is admitted with today's full sync; a Horovod-style script (reset callbacks, an ElasticSampler) sees one reset per
admission, as with the full sync, and trains every sample once.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections import Counter

import pytest

from tests.integration.harness import REPO, HostsFile, probe_cmd, worker_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FOLLOW_PROBE = REPO / "tests" / "integration" / "follow_probe.py"
_WINDOW = re.compile(r"rank\(s\) \[2\] follow from commit (\d+): (\d+) piece\(s\) over (\d+) commit\(s\)")
THREE = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
#: Follow mode on (the default, said for a run with it off in the environment), 400 bytes a commit: the probe's
#: model (about 2 kB of state with SGD momentum) needs a window of several commits.
SMALL_PIECES = {"CLOUD_ELASTIC_FOLLOW": "1", "CLOUD_ELASTIC_FOLLOW_MB": "0.0004"}


def _start(jobs, tmp_path, *probe_args: str, env: dict[str, str] | None = None, hosts: HostsFile | None = None,
           extra: tuple[str, ...] = ()):
    stop = tmp_path / "stop"
    hosts = hosts or HostsFile(tmp_path, THREE[:2])
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", *extra, sys.executable, str(FOLLOW_PROBE), "--steps", "5",
                "--stop-when", str(stop), *probe_args], env={**SMALL_PIECES, **(env or {})})
    job.wait_event("commit", rank=0, step=3, timeout=60)
    hosts.set(THREE)
    return job, stop


def _all_entered_alike(job, size: int):
    """The first entry of ``size`` workers at one step with one checksum (the end of a window), or None."""
    by_step: dict[int, list] = {}
    for e in job.of("entered", size=size):
        by_step.setdefault(e["step"], []).append(e)
    for step in sorted(by_step):
        group = by_step[step]
        if len(group) >= size and len({e["checksum"] for e in group}) == 1 and not any(e["following"] for e in group):
            return group
    return None


def _finish_alike(job, stop, size: int | None = None) -> list:
    """Stop the job; every worker ends at one step with one state (``size`` workers, or as many as the last round)."""
    stop.touch()
    assert job.finish(timeout=60) == 0, job.output()
    done = job.of("done")
    size = size or (done[0]["size"] if done else 1)
    assert len(done) == size and len({e["checksum"] for e in done}) == 1 and len({e["step"] for e in done}) == 1, (done, job.output())
    return done


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_follower_ends_bit_equal_to_the_running_workers(jobs, tmp_path, optimizer):
    job, stop = _start(jobs, tmp_path, "--optimizer", optimizer)
    entered = job.wait_for(lambda j: _all_entered_alike(j, 3), 60, "3 workers entering alike at size 3")
    window = [m for m in map(_WINDOW.search, job.lines) if m]
    assert window and int(window[0].group(3)) > 1, job.output()  # the state came over several commits
    # The follower entered the admitting round with its own initial state, following, before the window ended.
    first = [e for e in job.of("entered", size=3) if e["worker"].startswith("127.0.0.3")][0]
    assert first["following"] and first["checksum"] != entered[0]["checksum"], job.of("entered")
    assert any("follow no more" in line and "every digest equal" in line for line in job.lines), job.output()
    # The pieces land in the follower's tensors as the follow machinery's, not as the script's change in place
    # (which would make every later commit of the follower copy its parameters).
    assert not any("changed in place outside the optimizer" in line for line in job.lines), job.output()
    assert len({e["round"] for e in job.of("entered", size=2)}) == 1, job.of("entered")  # no round of two again
    # BatchNorm's statistics are each worker's own: the follower has rank 0's, as after a sync.
    buffers = {e["rank"]: e["buffers"] for e in entered}
    assert buffers[2] == buffers[0], entered
    _finish_alike(job, stop, 3)


def test_a_metric_averaged_during_the_window_leaves_the_follower_out(jobs, tmp_path):
    job, stop = _start(jobs, tmp_path, "--metric")
    job.wait_for(lambda j: _all_entered_alike(j, 3), 60, "3 workers entering alike at size 3")
    during = [e for e in job.of("metric", size=3) if e["following"]]
    after = [e for e in job.of("metric", size=3) if not e["following"]]
    assert during and all(e["value"] == 1.5 for e in during), during  # (1 + 2) / 2: rank 2's 3 left out
    job.wait_for(lambda j: [e for e in j.of("metric", size=3) if not e["following"]], 30, "a metric after")
    after = [e for e in job.of("metric", size=3) if not e["following"]]
    assert all(e["value"] == 2.0 for e in after), after  # (1 + 2 + 3) / 3 once it is active
    _finish_alike(job, stop, 3)


@pytest.mark.parametrize("victim", ["127.0.0.2", "127.0.0.3"])
def test_a_worker_killed_during_the_window_costs_a_failure_and_no_state(jobs, tmp_path, victim):
    # 40 bytes a commit: a window of dozens of commits, so the kill lands inside it.
    job, stop = _start(jobs, tmp_path, "--optimizer", "adam", env={"CLOUD_ELASTIC_FOLLOW_MB": "0.00004"})
    job.wait_for(lambda j: any(_WINDOW.search(line) for line in j.lines), 60, "a follow window")
    job.wait_for(lambda j: len(j.of("commit", size=3)) >= 9, 60, "commits in the window")
    os.kill(worker_on(job.job_id(), victim), signal.SIGKILL)
    # The survivors go on at size 2; a killed holder's host comes back and is admitted again (follow or sync).
    job.wait_for(lambda j: any("rolling back to the last commit" in line for line in j.lines), 60, "a rollback")
    before = max(e["step"] for e in job.of("commit"))
    job.wait_for(lambda j: max(e["step"] for e in j.of("commit")) >= before + 5, 60, "training on after the kill")
    done = _finish_alike(job, stop)
    # Nothing trained from initial weights: every worker that syncs after the kill gets the survivors' commit
    # (the same checksum as theirs at the end), and the job's steps went on from where they were.
    assert all(e["step"] >= before + 5 for e in done), done
    assert not any("training state lost" in line for line in job.lines), job.output()
    if victim != "127.0.0.3":  # the follower survived: it says why its own state is not the commit
        assert any("a peer failed while this worker was still receiving it (follow mode)" in line
                   for line in job.lines), job.output()


def test_an_optimizer_nobody_can_follow_is_admitted_with_the_full_sync(jobs, tmp_path):
    job, stop = _start(jobs, tmp_path, "--optimizer", "unsupported")
    entered = job.wait_for(lambda j: _all_entered_alike(j, 3), 60, "3 workers entering alike at size 3")
    assert not any(e["following"] for e in job.of("entered")), job.of("entered")
    assert any("no follow mode: optimizer MySGD not followed" in line for line in job.lines), job.output()
    assert entered[0]["step"] == min(e["step"] for e in job.of("entered", size=3))  # equal at its first entry
    _finish_alike(job, stop, 3)


def test_a_horovod_style_script_sees_one_reset_per_admission(jobs, tmp_path):
    """probe.py is in the shape of Horovod's examples: a reset callback, an ElasticSampler in the TorchState,
    ``set_epoch`` and ``record_batch``. The newcomer follows; the end of the window re-shards the sampler and enters
    the training function again, without the reset callbacks: each worker that was there sees one reset, at the
    admission, with ``hvd.size()`` 3, and the newcomer none, as with the full sync; every sample of every epoch is
    trained once (a follower's batches are not trained)."""
    n, hosts, stop = 48, HostsFile(tmp_path, THREE[:2]), tmp_path / "stop"
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2",
                *probe_cmd("--sampler", str(n), "--epochs", "2", "--stop-when", str(stop))], env=SMALL_PIECES)
    job.wait_event("commit", rank=0, step=3, timeout=60)
    hosts.set(THREE)
    job.wait_for(lambda j: any("follow no more" in line for line in j.lines), 60, "the end of the follow window")
    job.wait_for(lambda j: len([e for e in j.of("batch", size=3) if not e["following"]]) >= 9, 60,
                 "three steps at size 3 after the window")
    stop.touch()
    assert job.finish(timeout=60) == 0, job.output()
    window = [m for m in map(_WINDOW.search, job.lines) if m]
    assert window and int(window[0].group(3)) > 1, job.output()  # it followed, over several commits
    resets = sorted((e["worker"].split("[")[0], e["size"]) for e in job.of("reset"))
    assert resets == [("127.0.0.1", 3), ("127.0.0.2", 3)], job.of("reset")  # none on the newcomer (127.0.0.3)
    trained = [e for e in job.of("batch") if not e["following"]]
    for epoch in sorted({e["epoch"] for e in trained}):
        seen = Counter(i for e in trained if e["epoch"] == epoch for i in e["indices"])
        assert set(seen) == set(range(n)) and max(seen.values()) == 1, (epoch, seen, job.output())
    done = job.of("done")
    assert len(done) == 3 and len({e["checksum"] for e in done}) == 1, done
