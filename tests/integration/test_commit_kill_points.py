"""Survivors continue from exactly the last commit, whichever optimizer, wherever in a step a peer dies.

One job per optimizer, committing every step, where peers SIGKILL themselves
one at a time at points of a step (see ``commit_probe.py``): during backward,
between gradient buckets, during the update, and in a collective between
``step()`` and ``commit()``. After each failure, the state the survivors
resume from (model, every optimizer state tensor, step counter) must hash to
exactly what the survivor committed at that step.

Every optimizer meets the points where its own update has run (or may have
run) when the peer dies: with commits kept, between buckets (finished buckets
may be updated already), in the update and in the collective after it; with
commits in place, in the update. A death during backward comes before any
bucket or update, so what survivors restore there does not depend on the
optimizer: adamw meets every point, the others only theirs (one worker each
fewer; the suite runs 21 fewer workers for the same restore paths). The last
test runs a GAN-style loop with two optimizers after one backward
(``gan_probe.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.commit_probe import OPTIMIZERS

PROBE = str(Path(__file__).with_name("commit_probe.py"))
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
#: With a loss allreduce every fourth step (commits kept): point -> (state.step at the start of the step a
#: peer dies in, the step survivors resume from), in the order the peers die.
KEPT_POINTS = {
    "backward": (2, 2),
    "buckets": (5, 5),
    "update": (8, 9),  # survivors finish that step and commit it; the next one fails
    "collective": (11, 11),
}


def by_optimizer(every_point: dict, own_points: tuple[str, ...]) -> list:
    """(optimizer, points) for each optimizer: adamw meets every point, the others those where their update
    has run (see the module docstring)."""
    return [pytest.param(name, every_point if name == "adamw" else {p: every_point[p] for p in own_points}, id=name)
            for name in sorted(OPTIMIZERS)]


def kill_plan(points: dict) -> dict[str, tuple[str, int, int]]:
    """host -> (point, step, resumed from): 127.0.0.1 survives, the next hosts die in the points' order."""
    return {host: (point, *steps) for host, (point, steps) in zip(HOSTS[1:], points.items())}


def expected_resumes(plan: dict, job, got: list[int]) -> list[int]:
    """The steps survivors resume from, one per death in the plan's order: the step each point names, or the one
    before it where no survivor of that death committed the step it names, at that round's size.

    The second happens by design on a loaded machine: the victim finished the last collective before its death
    (an ``update`` point: that step's allreduce; ``buckets``: the previous step's), but a survivor's wait for it
    still failed, because the driver's abort reached it before the wait began ("completed, but the driver aborted
    round", ``RoundGroupsMixin.wait``) or the victim's SIGKILL reset the connection before it read the last chunk;
    it rolls back to the commit before. Survivors resume from the newest commit any of them holds, so a step
    that one survivor committed is never given up for an older one; that stays exact (two clean-clone runs side
    by side, load 13, had all three survivors of a ``buckets`` death at step 5 roll back to step 4)."""
    hosts = HOSTS[: len(plan) + 1]
    victims = list(plan)
    expected = []
    for i, ((_, _, resume), g) in enumerate(zip(plan.values(), got)):
        survivors = set(hosts) - set(victims[: i + 1])
        size = len(hosts) - i  # the round the i-th death ended
        held = any(e.kind == "commit" and e["step"] == resume and e["size"] == size and e.data.get("host") in survivors
                   for e in job.events)
        expected.append(resume - 1 if g == resume - 1 and not held else resume)
    return expected


def committed(job) -> dict[int, set[str]]:
    """step -> the checksums any worker committed at that step in a round of more than one. Survivors resume
    from the newest commit any of them holds: one whose wait the driver's abort reached first rolls back to
    the commit before, and then resumes from a peer's commit that it never made itself."""
    out: dict[int, set[str]] = {}
    for e in job.events:
        if e.kind == "commit" and e["size"] > 1:
            out.setdefault(e["step"], set()).add(e["checksum"])
    return out


def kill_job(jobs, plan: dict, optimizer: str, *extra: str):
    hosts = HOSTS[: len(plan) + 1]
    kill = ",".join(f"{host}:{point}:{step}" for host, (point, step, _) in plan.items())
    return jobs(["run", "-np", str(len(hosts)), "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
                 "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
                 sys.executable, PROBE, "--optimizer", optimizer, *extra, "--kill", kill])


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("optimizer", "points"), by_optimizer(KEPT_POINTS, ("buckets", "update", "collective")))
def test_survivors_resume_exactly_from_the_last_commit(jobs, optimizer, points):
    plan = kill_plan(points)
    job = kill_job(jobs, plan, optimizer, "--steps", "16")
    assert job.finish(timeout=220) == 0, job.output()[-4000:]
    survivor = [e for e in job.events if e.data.get("host") == "127.0.0.1"]
    commits = committed(job)
    resumed = [e for e in survivor if e.kind == "resumed"][1:]  # the first one is the start
    got = [e["step"] for e in resumed]
    assert got == expected_resumes(plan, job, got)
    assert [e["size"] for e in resumed] == list(range(len(plan), 0, -1))
    for e in resumed:
        assert e["checksum"] in commits.get(e["step"], ()), f"resumed at step {e['step']} from a state never committed"
    # The collective point: the peer dies after its window, its gradient allreduce of step 11 complete. As a rule
    # the survivor's completes too: it updates its parameters, fails in the loss allreduce after its window, and
    # the restore undoes that update. Under load its own wait may fail all the same (the peer's SIGKILL, with data
    # unread, resets the connection before the survivor read the last chunk; or the driver's abort reaches it
    # before it waits): it fails in that allreduce, before its window. It resumes from the commit of step 11
    # either way (checked above, against the commits made).
    window = next((e for e in survivor if e.kind == "window" and e["step"] == 12 and e["size"] == 2), None)
    failed = [(e["step"], e["at"]) for e in survivor if e.kind == "failed" and e["size"] == 2]
    if window is not None:
        assert failed == [(11, "loss")]
        assert window["checksum"] != resumed[-1]["checksum"]
    else:
        assert failed == [(11, "gradients")]
    done = next(e for e in survivor if e.kind == "done")
    assert done["step"] == 16 and done["size"] == 1


@pytest.mark.timeout(150)
def test_survivors_resume_from_the_newest_commit_any_of_them_holds(jobs):
    # 127.0.0.3 dies right after committing step 5; 127.0.0.2 committed it too and fails in the next step;
    # 127.0.0.1 (rank 0) fails in a collective before its commit of step 5 and rolls back to step 4.
    # The round of two must continue from step 5, 127.0.0.2's commit, not from rank 0's older one.
    hosts = HOSTS[:3]
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
                "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
                sys.executable, PROBE, "--optimizer", "adamw", "--steps", "8",
                "--kill", "127.0.0.3:after-commit:4,127.0.0.1:lonely:4"])
    assert job.finish(timeout=130) == 0, job.output()[-4000:]
    committed = {(e["host"], e["step"]): e["checksum"] for e in job.events if e.kind == "commit"}
    assert ("127.0.0.2", 5) in committed and ("127.0.0.1", 5) not in committed
    resumed = [e for e in job.events if e.kind == "resumed" and e["size"] == 2]
    assert sorted(e["host"] for e in resumed) == ["127.0.0.1", "127.0.0.2"]
    for e in resumed:
        assert e["step"] == 5 and e["checksum"] == committed[("127.0.0.2", 5)], e
    done = [e for e in job.events if e.kind == "done"]
    assert len({e["checksum"] for e in done}) == 1 and all(e["step"] == 8 for e in done)


#: The common loop (no collective between step() and commit()): from its second commit on, commits keep
#: nothing of the parameters and optimizer state (``worker.window``); point -> (step, resumed from).
COMMON_POINTS = {
    "backward": (3, 3),
    "buckets": (6, 6),  # updates wait for every bucket: nothing changed, nothing to undo
    "update": (9, 10),
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("optimizer", "points"), by_optimizer(COMMON_POINTS, ("update",)))
def test_in_the_common_loop_commits_kept_in_place_restore_exactly(jobs, optimizer, points):
    plan = kill_plan(points)
    job = kill_job(jobs, plan, optimizer, "--steps", "13", "--log-every", "0")
    assert job.finish(timeout=180) == 0, job.output()[-4000:]
    survivor = [e for e in job.events if e.data.get("host") == "127.0.0.1"]
    commits = committed(job)
    resumed = [e for e in survivor if e.kind == "resumed"][1:]
    got = [e["step"] for e in resumed]
    assert got == expected_resumes(plan, job, got)
    for e in resumed:
        assert e["checksum"] in commits.get(e["step"], ()), f"resumed at step {e['step']} from a state never committed"
    assert "cannot restore the last commit exactly" not in job.output()
    # Every commit kept nothing of parameters and optimizer state.
    assert all(e["in_place"] for e in survivor if e.kind == "commit")
    done = next(e for e in survivor if e.kind == "done")
    assert done["step"] == 13 and done["size"] == 1


@pytest.mark.timeout(150)
def test_a_failure_in_the_first_collective_after_an_in_place_update_stops_the_job_saying_why(jobs, tmp_path):
    # The loop committed right after every step (its commits kept nothing), then logs once, at step 5,
    # between step() and commit(); 127.0.0.2 dies in that allreduce once every worker has updated in place
    # (--window-barrier: a survivor still short of its update holds its commit exactly, and the job rightly
    # trains on from it; a loaded clean clone had one so). No survivor can restore its commit exactly and there
    # is no checkpoint: the job must stop, not train on from a wrong state.
    hosts = HOSTS[:3]
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
                "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
                sys.executable, PROBE, "--optimizer", "adamw", "--steps", "8", "--log-every", "0", "--log-at", "5",
                "--kill", "127.0.0.2:collective:5", "--window-barrier", str(tmp_path)])
    assert job.finish(timeout=130) == 1, job.output()[-4000:]
    out = job.output()
    assert "training state lost: no survivor could restore the last commit exactly" in out, out[-4000:]
    assert not [e for e in job.events if e.kind == "resumed" and e["size"] == 2]
    assert not [e for e in job.events if e.kind == "done"]


@pytest.mark.timeout(150)
def test_two_optimizers_after_one_backward_resume_exactly_when_a_peer_dies_between_their_updates(jobs):
    # A GAN-style loop (gan_probe.py): one backward, opt_a.step(), opt_b.step(), commit(). 127.0.0.3 dies
    # in step 4 once model A's allreduces are done: the survivors update model A, then fail in opt_b's.
    # They must resume from the commit of step 4, model A's update undone (before, every commit was kept
    # in place and no survivor could restore: the job stopped with "training state lost").
    hosts = HOSTS[:3]
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", ",".join(f"{h}:1" for h in hosts),
                "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
                sys.executable, str(Path(__file__).with_name("gan_probe.py")), "--steps", "8",
                "--kill", "127.0.0.3:4"])
    assert job.finish(timeout=130) == 0, job.output()[-4000:]
    assert "cannot restore the last commit exactly" not in job.output()
    for host in hosts[:2]:
        mine = [e for e in job.events if e.data.get("host") == host]
        commits = {e["step"]: e["checksum"] for e in mine if e.kind == "commit"}
        resumed = [e for e in mine if e.kind == "resumed"][1:]
        assert [(e["step"], e["size"]) for e in resumed] == [(4, 2)], resumed
        assert resumed[0]["checksum"] == commits[4]
        assert next(e for e in mine if e.kind == "done")["step"] == 8
