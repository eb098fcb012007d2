"""The same failure again and again without progress ends its loop (cloud_elastic.driver.job.repeats).

A slot whose worker fails REPEATS times at the same commit is blacklisted for good; a job resumed from its
checkpoint whose every worker fails REPEATS times in a row before a commit past it ends; so does a round that
re-forms unchanged and stalls REPEATS times in a row at the same commit. Each end line names the worker or the
collective and the error.
"""

from __future__ import annotations

import json
import math
import random
from typing import Callable

import pytest

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.completion import STACKS_WAIT_S, Completion
from cloud_elastic.driver.job.failures import Failures
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.job.liveness import SilenceWatch
from cloud_elastic.driver.job.repeats import REPEATS
from cloud_elastic.driver.runtime.signal_stacks import SignalStacks
from cloud_elastic.protocol import FlightEntry
from cloud_elastic.providers.api import DiscoveredHosts
from tests.unit.job_view import T0, FakeJob, S
from cloud_elastic.driver.job.exit_status import ExitStatus
from tests.unit.test_job import KILLED, UNREACHABLE, Sim, failed, started

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)

BUG = "ValueError: user bug at step 7"


def crash(sim: Sim, slot: str, error: str = BUG) -> None:
    """The worker on ``slot`` says it exits with ``error`` (its exit hook), then its process ends with code 1."""
    sim.job.adoption.exiting(sim.id(slot), 1, error + "\n  more lines of the traceback")
    sim.exit(slot)


def at_commit(sim: Sim, slot: str, seq: int) -> None:
    """The worker on ``slot`` reports commit ``seq`` of the job's history (its heartbeat)."""
    sim.commits[sim.id(slot)] = seq
    sim.job.heartbeat(sim.id(slot), sim.now, seq, commit_seq=seq)


# ------------------------------------------------------------------ the blacklist
def test_the_third_failure_of_a_slot_at_the_same_commit_blacklists_it_for_good() -> None:
    blacklist = Blacklist((1.0, 2.0), random.Random(0))
    a = Slot("a", 0)
    delays = [blacklist.record_failure(a, T0, at_commit=c) for c in (5, 5, 6, 6)]
    assert all(d < 3 for d in delays)  # a commit past 5 in between: the count starts again
    assert blacklist.record_failure(a, T0, at_commit=6) == math.inf
    assert blacklist.blocked(a, T0 + 1e9) and blacklist.for_good_slots() == [(a, 5)]
    assert blacklist.blocked_slots(T0) == []  # cooling down: none (status lists only cooldowns)
    assert blacklist.record_failure(a, T0) == math.inf and blacklist.retry_soon(a, T0) == math.inf  # stays so
    blacklist.forget_host("a")  # another instance at the address
    assert not blacklist.blocked(a, T0)


@pytest.mark.parametrize("status", [KILLED, ExitStatus(-15), ExitStatus(137), UNREACHABLE],
                         ids=["SIGKILL", "SIGTERM", "137-from-a-shell", "host-unreachable"])
def test_a_preempted_or_flapping_host_is_relaunched_each_time_and_the_healthy_job_goes_on(status) -> None:
    """The reviewer's a1: the worker on b[0] is killed from outside (a reclaim, a preemption, the OOM killer) or its
    host cannot be reached, again and again before the job's next commit: the usual cooldown each time, never the
    rest of the job (-np 2 --min-np 2 ended, below --min-np, though the script was healthy)."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=5)
    at_commit(sim, "a[0]", 6)
    for _ in range(REPEATS + 1):
        sim.exit("b[0]", status)
        sim.join("a[0]", reason="failure")
        sim.advance(3)  # past the cooldown: a new worker on b[0] joins the survivor at commit 6
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"] and sim.outcome is None
    assert sim.slots_launched().count("b[0]") == REPEATS + 2
    events = [f for k, f in sim.events if k == "worker_failed"]
    assert len(events) == REPEATS + 1 and all(f["blacklisted_s"] is not None for f in events), events
    assert not any(f.get("blacklisted_for_good") for f in events) and sim.job.hosts.blacklist.for_good_slots() == []


def test_a_crash_signal_counts_as_the_workers_own_failure() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=5)
    for _ in range(REPEATS):
        sim.exit("b[0]", ExitStatus(-11))  # SIGSEGV
        sim.join("a[0]", reason="failure")
        sim.advance(3)
        if sim.job.hosts.blacklist.for_good(Slot("b", 0)):
            break
        sim.join("b[0]")
    assert sim.job.hosts.blacklist.for_good(Slot("b", 0))
    assert sim.slots_launched().count("b[0]") == REPEATS


def test_status_shows_a_slot_blacklisted_for_good() -> None:
    """``cloud-elastic status`` listed only cooldowns: a slot out for the rest of the job did not show at all."""
    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.job.status_reply import status_reply
    from cloud_elastic.status import StatusReply, render_status

    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(0.0, 0.0))
    crash(sim, "b[0]")  # 0 0: out for the rest of the job at its first failure of its own doing
    reply = status_reply(sim.job, JobConfig(command=("python", "t.py"), num_proc=2, min_np=1, max_np=2),
                         provider="static", now=sim.now, wall_now=sim.now, uptime_s=60)
    text = render_status(StatusReply.from_json(json.loads(json.dumps(reply.to_json(), allow_nan=False))),
                         now=sim.now)
    assert "blacklisted:\n  b[0] for the rest of the job (1 failure)\n" in text, text


def test_a_drain_of_a_slot_already_blacklisted_for_good_writes_no_infinity(caplog) -> None:
    """A hand drain (or a straggler) of a worker whose slot is already out for the rest of the job (a host-mate's
    failure under --whole-hosts) said 'blacklisted for infs' and would write blacklisted_s Infinity, which is not JSON."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(1.0, 2.0))
    for _ in range(REPEATS):
        sim.job.hosts.blacklist.record_failure(Slot("b", 0), sim.now, at_commit=0)
    done, message = sim.job.drain("b", 0, sim.now)
    assert done and message.endswith("slot b[0] blacklisted for the rest of the job"), message
    assert "inf" not in caplog.text
    for _, fields in sim.events:
        json.dumps(fields, allow_nan=False)


def b_out_for_good(sim: Sim) -> None:
    """The script fails on b[0] REPEATS times at commit 6: the slot is out for the rest of the job."""
    at_commit(sim, "a[0]", 6)
    for _ in range(REPEATS):
        crash(sim, "b[0]")
        sim.join("a[0]", reason="failure")
        sim.advance(3)
        if not sim.job.hosts.blacklist.for_good(Slot("b", 0)):
            sim.join("b[0]")
    assert sim.job.hosts.blacklist.for_good(Slot("b", 0)) and sim.slots_launched().count("b[0]") == REPEATS


def rediscover(sim: Sim, b_instance: str) -> None:
    sim.job.discovered(DiscoveredHosts(ready={"a": 1, "b": 1}, instances={"a": "i-a", "b": b_instance}), sim.now)
    sim._collect()


def test_a_host_blacklisted_for_good_that_leaves_discovery_and_comes_back_as_another_instance_is_launched_on() -> None:
    """The reviewer's a3: the host left discovery (the VM is gone) and a healthy one of the same name came back."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    rediscover(sim, "i-b1")
    b_out_for_good(sim)
    sim.discover({"a": 1})
    sim.advance(1)
    rediscover(sim, "i-b2")
    sim.advance(1)
    assert sim.slots_launched().count("b[0]") == REPEATS + 1  # a new machine: launched on at once
    assert sim.outcome is None


@pytest.mark.parametrize("instance", ["i-b1", None], ids=["same-instance-id", "no-instance-id"])
def test_a_flapping_host_blacklisted_for_good_stays_so_when_it_comes_back_as_the_same_machine(instance) -> None:
    """The reviewer's e3: a host whose script fails flaps in and out of discovery; its block for the rest of the
    job was forgotten each time it left, so its slot was relaunched (and failed again) for ever."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    if instance:
        rediscover(sim, instance)
    b_out_for_good(sim)
    for _ in range(3):
        sim.discover({"a": 1})
        sim.advance(1)
        if instance:
            rediscover(sim, instance)
        else:
            sim.discover({"a": 1, "b": 1})
        sim.advance(5)
    assert sim.slots_launched().count("b[0]") == REPEATS  # never launched on again
    assert sim.job.hosts.blacklist.for_good(Slot("b", 0)) and sim.outcome is None


def test_zero_zero_blacklists_a_failed_slot_for_good_as_horovod_does_and_other_blocks_not_at_all() -> None:
    blacklist = Blacklist((0.0, 0.0))
    assert blacklist.record_failure(Slot("a", 0), T0, at_commit=0) == math.inf
    assert blacklist.blocked(Slot("a", 0), T0 + 1e9)
    assert blacklist.record_failure(Slot("a", 1), T0) == 0.0  # killed from outside, a straggler, a drain
    assert not blacklist.blocked(Slot("a", 1), T0)


@pytest.mark.parametrize("status", [KILLED, ExitStatus(137)], ids=["SIGKILL", "137-from-a-shell"])
def test_zero_zero_blacklists_a_slot_whose_worker_was_killed_for_good_as_horovod_does(status) -> None:
    """The reviewer's e4: under 0 0 an OOM-killed worker was relaunched at once, again and again (64 SIGKILLs in
    60 s); --help says 0 0 blocks a failed slot for the rest of the job, whatever the failure."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(0.0, 0.0))
    sim.exit("b[0]", status)
    sim.join("a[0]", reason="failure")
    sim.advance(5)
    assert sim.slots_launched().count("b[0]") == 1 and sim.job.hosts.blacklist.for_good(Slot("b", 0))
    events = [f for k, f in sim.events if k == "worker_failed"]
    assert [f.get("blacklisted_for_good") for f in events] == [True], events
    assert sim.outcome is None and sim.layout() == ["a[0]"]


def test_zero_zero_does_not_blacklist_a_host_out_of_reach_for_good_while_its_other_workers_run() -> None:
    """An SSH transport failure is the network's, not the worker's: under 0 0 the slots are tried again, not lost."""
    sim = started(3, {"a": 2, "b": 1}, min_np=2, cooldown=(0.0, 0.0))
    sim.exit("a[0]", UNREACHABLE)
    sim.join("a[1]", "b[0]", reason="failure")
    sim.advance(1)
    assert sim.job.hosts.blacklist.for_good_slots() == [] and sim.outcome is None
    assert sim.slots_launched().count("a[0]") == 2  # tried again
    assert not any(f.get("blacklisted_for_good") for k, f in sim.events if k == "worker_failed")


# ------------------------------------------------------------------ a slot's crash loop
def test_a_slot_that_crashes_at_the_same_step_is_not_relaunched_forever_and_the_job_ends_naming_it() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=5)
    at_commit(sim, "a[0]", 6)
    for n in range(1, REPEATS + 1):
        crash(sim, "b[0]")
        sim.join("a[0]", reason="failure")
        if n < REPEATS:
            sim.advance(3)  # past the cooldown: a new worker on b[0] joins the survivor at commit 6
            sim.join("b[0]")
            assert sim.layout() == ["a[0]", "b[0]"]
    events = [f for k, f in sim.events if k == "worker_failed"]
    assert events[-1]["blacklisted_s"] is None and events[-1]["blacklisted_for_good"] is True
    sim.advance(10)
    assert sim.slots_launched().count("b[0]") == REPEATS  # never again
    failed(sim, "fewer than --min-np 2", f"(rank 1) exited with code 1: {BUG};",
           f"slot b[0] is blacklisted for the rest of the job: it failed {REPEATS} times in a row at commit 6")
    assert "\n" not in sim.outcome.reason


def test_an_elastic_failure_line_carries_the_error_the_worker_reported() -> None:
    sim = started(2, {"a": 2}, min_np=2)
    crash(sim, "a[0]")
    crash(sim, "a[1]", "RuntimeError: CUDA error: an illegal memory access")
    failed(sim, "all workers failed; last: worker a[1]#2 (rank 1) exited with code 1: RuntimeError: CUDA error")


# ------------------------------------------------------------------ a resume loop
def resume_attempt(sim: Sim, *, commit: bool = False, status: ExitStatus | None = None) -> None:
    """The workers lost, new ones on a[0] and b[0] resume from the checkpoint of commit 6 and all fail again
    (``status``: killed that way from outside, else crashing with the bug)."""
    sim.advance(3)
    sim.join("a[0]", "b[0]")
    assert sim.job.workers[sim.id("a[0]")].round == sim.job.round
    sim.job.checkpoint_loaded(6, 6, "/ck/step6")
    if commit:
        at_commit(sim, "a[0]", 7)
    for slot in ("a[0]", "b[0]"):
        if status is None:
            crash(sim, slot)
        else:
            sim.exit(slot, status)


def test_every_worker_failing_again_before_a_commit_past_the_checkpoint_ends_the_resume_loop() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    crash(sim, "a[0]")
    crash(sim, "b[0]")
    for _ in range(REPEATS - 2):
        resume_attempt(sim)
        assert sim.outcome is None
    resume_attempt(sim)
    failed(sim, f"every worker failed, {REPEATS} time(s) in a row at commit 6, resuming from the checkpoint in between "
                f"without getting further", f"exited with code 1: {BUG}")


def test_a_spot_storm_that_kills_every_worker_again_and_again_resumes_each_time() -> None:
    """The reviewer's b1: with --checkpoint-dir, every worker SIGKILLed together three times (the last two before
    the resumed attempt's first commit) ended a healthy job 'every worker failed, 3 time(s) in a row'."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    for _ in range(REPEATS + 1):
        resume_attempt(sim, status=KILLED)
        assert sim.outcome is None
    assert sim.job.hosts.blacklist.for_good_slots() == []
    sim.advance(3)
    sim.join("a[0]", "b[0]")  # the storm is over: the next attempt resumes and trains on
    assert sim.layout() == ["a[0]", "b[0]"] and sim.outcome is None


def test_attempts_that_train_past_an_older_checkpoint_and_fail_at_the_same_commit_each_time_end_too() -> None:
    """A bug far past the checkpoint: each resumed attempt commits up to it and fails there again."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 9)
    crash(sim, "a[0]")
    crash(sim, "b[0]")
    for n in range(REPEATS - 1):
        sim.advance(3)
        sim.join("a[0]", "b[0]")
        sim.job.checkpoint_loaded(6, 6, "/ck/step6")
        at_commit(sim, "a[0]", 9)  # commits 7, 8, 9: past the checkpoint, and no further than the time before
        assert sim.outcome is None
        crash(sim, "a[0]")
        crash(sim, "b[0]")
    failed(sim, f"every worker failed, {REPEATS} time(s) in a row at commit 9")


def test_a_resumed_round_that_commits_past_its_checkpoint_starts_the_count_again() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    resume_attempt(sim)
    resume_attempt(sim, commit=True)  # commit 7: progress, the count starts again
    for _ in range(REPEATS - 2):
        resume_attempt(sim)
    assert sim.outcome is None
    resume_attempt(sim)
    failed(sim, f"every worker failed, {REPEATS} time(s) in a row")


def test_every_worker_lost_with_every_slot_blacklisted_for_repeating_its_failure_ends_at_once() -> None:
    """Attempts that do not all fail together (one worker resumes alone while the other starts) bring each slot
    to its third failure before the job counts three losses of every worker: nothing is left to resume on."""
    job = FakeJob(2, min_np=1, checkpointing=True, hosts=HostManager(Blacklist((1.0, 2.0), random.Random(0))))
    job.hosts.update(DiscoveredHosts(ready={"a": 1, "b": 1}), T0)
    job.phase, job.round, job.state_committed, job.commit_high = Phase.RUNNING, 5, True, 6
    fail = Failures(job, lambda w, what, now: True)
    job.hosts.blacklist.record_failure(Slot("b", 0), T0, at_commit=6)
    for _ in range(REPEATS - 1):
        job.hosts.blacklist.record_failure(Slot("a", 0), T0, at_commit=6)
        job.hosts.blacklist.record_failure(Slot("b", 0), T0, at_commit=6)
    assert job.hosts.blacklist.for_good(Slot("b", 0)) and not job.hosts.blacklist.for_good(Slot("a", 0))
    w = job.worker("a", 0, S.EXITED, round_=5, rank=0)
    w.error = BUG
    fail.fail(w, "exited with code 1", T0, was_member=True, transport=False, exit_code=1)
    assert not job.outcome.success and job.outcome.exit_code == 1
    assert "resuming again would fail the same way" in job.outcome.reason and BUG in job.outcome.reason


# ------------------------------------------------------------------ a hang loop
#: What a deadlocked rank 1 sends when asked for its stacks (``format_stacks``): its main thread, marked, in train.py.
STACKS = ('Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
          '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
          'Current thread 0x2 (most recent call first):\n  File "/ce/worker/link/driver_link.py", line 328 in _send_stacks\n'
          '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
          'Thread 0x3 (the main thread; most recent call first):\n  File "/job/train.py", line 33 in train\n'
          '  File "/ce/worker/elastic.py", line 159 in _run\n  File "/job/train.py", line 48 in <module>\n'
          '  File "<frozen runpy>", line 198 in _run_module_as_main\n\nFlight record (last 8 collectives, newest last):\n')
FRAME = '"/job/train.py", line 33 in train'
#: What a worker whose interpreter is held by native code prints on the driver's stacks signal (faulthandler's
#: handler needs no GIL), as its output carries it: one block per thread, a blank line between them.
PRINTED = ('Thread 0x00007f29d16806c0 (most recent call first):\n'
           '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
           '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
           'Current thread 0x00007f29f3dc1b80 (most recent call first):\n'
           '  File "/job/train3.py", line 34 in train\n  File "/ce/worker/elastic.py", line 159 in _run\n'
           '  File "/job/train3.py", line 49 in <module>\n  File "<frozen runpy>", line 88 in _run_code\n')
PRINTED_FRAME = '"/job/train3.py", line 34 in train'
#: What a worker whose link to the driver alone was cut prints: its main thread waits on the driver's answer.
CUT = PRINTED.replace('  File "/job/train3.py", line 34 in train\n',
                      '  File "/venv/lib/python3.11/site-packages/cloud_elastic/worker/link/driver_link.py", line 399 in '
                      'await_current_view\n  File "/job/train3.py", line 34 in train\n')


def signalled(sim: Sim, worker_id: str, printed: bool | str) -> None:
    """The driver's stop path asked ``worker_id`` (given up) for its stacks by signal, killed it a second later and
    reports what its output carried: :data:`PRINTED` (a hang holding the GIL) or nothing (its host frozen or out of
    reach: the signal never ran), gathered as the driver gathers it (:class:`SignalStacks`)."""
    gathered = SignalStacks()
    gathered.expect(worker_id)
    for line in (printed if isinstance(printed, str) else PRINTED if printed else "").splitlines():
        gathered.offer(worker_id, line)
    sim.job.signal_stacks(worker_id, gathered.take(worker_id))
    sim._collect()


def hangs(sim: Sim, how: str, commit: int, *, survivor_commits: bool = False) -> None:
    """The worker on b[0] (rank 1) has joined a[0] at ``commit`` and hangs there until the driver gives it up;
    the driver's kill then ends its process, and a new one on b[0] joins a[0] again once its slot cooled down.

    ``how``: "deadlock" (it heartbeats, answers the stacks request, never comes back after the round's abort),
    "silent" (its heartbeats stop: a GIL held by native code; it prints its stacks on the driver's signal),
    "frozen" (its heartbeats stop and it prints nothing: its host frozen, or its network down with the ssh session
    still open), or an :class:`ExitStatus` (its host stopped answering: the process ends that way before the driver
    gives it up). ``survivor_commits``: a[0] trains on alone meanwhile (an elastic job), one commit past ``commit``."""
    b = sim.id("b[0]")
    if how in ("silent", "frozen", "thaw", "unarmed", "cut"):
        sim.silent.add(b)
        sim.job.workers[b].stacks_signal = how != "unarmed"  # as its registration said
    elif isinstance(how, ExitStatus):
        sim.exit("b[0]", how)
    for i in range(100):  # 50 s of the job's clock: every give-up comes within 20 s
        a, w = sim.job.workers[sim.id("a[0]")], sim.job.workers[b]
        if how == "fast":
            beat_with_flights(sim, a, w, silent_after=8, i=i)
        if a.state is S.RUNNING and sim.job.abort_round >= a.round:
            sim.join("a[0]", reason="failure")  # rank 0 comes back at each abort
        for x in (a, w):
            if x.alive and x.stacks_wanted > x.stacks_sent:
                sim.job.stacks_received(x.worker_id, x.stacks_wanted, STACKS)
        if not w.alive:
            break
        sim.advance(0.5)
    else:
        raise AssertionError(f"b[0] was never given up: {w.state}")
    if how == "thaw":  # thawed within the second before its kill: its heartbeat arrives (ControlPlane._poll)
        sim.job.silence.heard(b, sim.job.running(sim.now), None)
    if how in ("silent", "frozen", "thaw", "fast", "unarmed", "cut"):
        signalled(sim, b, printed=CUT if how == "cut" else how in ("silent", "thaw", "fast"))
    if w.state is S.LOST:
        sim.exit("b[0]", KILLED)  # the driver's kill
    if sim.outcome is not None:
        return
    for _ in range(20):  # its slot cools down (1-2 s), then a new worker on b[0] starts and joins a[0]
        sim.advance(0.5)
        a = sim.job.workers[sim.id("a[0]")]
        if survivor_commits and a.state is S.RUNNING and a.round == sim.job.round:
            at_commit(sim, "a[0]", commit + 1)  # alone in a round of its own
        if sim.id("b[0]") != b:
            break
    at = sim.commits.get(sim.id("a[0]"), commit)
    sim.join("b[0]")
    a = sim.job.workers[sim.id("a[0]")]
    if a.state is S.WAITING or a.state is S.RUNNING and sim.layout() == ["a[0]"]:
        sim.join("a[0]", reason="failure" if a.state is S.WAITING else "update")  # an elastic job: at its commit
    assert sim.layout() == ["a[0]", "b[0]"], sim.layout()
    at_commit(sim, "a[0]", at)
    at_commit(sim, "b[0]", at)


def beat_with_flights(sim: Sim, a, w, *, silent_after: int, i: int) -> None:
    """The heartbeats' flight records (what ``ControlPlane._poll`` hands ``SilenceWatch.heard``): both ranks done with
    collective #4 of their round; from tick ``silent_after`` on ``w`` says nothing (its GIL held by one C call) and
    ``a`` waits for it in #5, so the fast rule gives ``w`` up well before --heartbeat-timeout."""
    if i == silent_after:
        sim.silent.add(w.worker_id)
    running = sim.job.running(sim.now)
    for x in (a, w):
        if x.alive and x.worker_id not in sim.silent:
            waiting = max(0.0, (i - silent_after) * 0.5)
            entered = x is a and i >= silent_after
            flight = FlightEntry(x.round, 5 if entered else 4, "gradient allreduce",
                                 "entered" if entered else "completed", waiting if entered else 0.0)
            sim.job.silence.heard(x.worker_id, running, flight)


def fixed(**policy) -> Sim:
    """-np 2 --min-np 2 on a[0] and b[0], both at commit 6 (--progress-timeout 5)."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), progress_timeout_s=5, elastic_timeout_s=60, **policy)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    return sim


@pytest.mark.parametrize("how, doing, remedy", [
    ("deadlock", f"its main thread at {FRAME}", "raise --progress-timeout if this step can take longer"),
    ("silent", f"silent (holding the GIL?), its main thread at {PRINTED_FRAME}",
     "raise --heartbeat-timeout if its script can hold the GIL that long"),
], ids=["deadlock", "gil-silent"])
def test_a_worker_that_hangs_at_the_same_commit_ends_a_fixed_size_job_at_the_third_give_up(how, doing, remedy) -> None:
    """The reviewer's e1 and e5: rank 1 deadlocks (a lock taken twice) or holds the GIL (a catastrophic regex) at the
    same step each time; -np 2 --min-np 2 never progressed and never ended: rank 1 was given up (its round aborted
    after --progress-timeout, or silent), relaunched, and hung again, for ever. Its slot is not blacklisted for good
    (a straggler may well be slow that long); the job ends at the third give-up, naming the worker, where its main
    thread was (a silent one: the frame it printed on the stacks signal) and the timeout that gave it up (silence is
    judged against --heartbeat-timeout, not --progress-timeout)."""
    sim = fixed()
    for n in range(1, REPEATS + 1):
        hangs(sim, how, 6)
        assert (sim.outcome is None) == (n < REPEATS), n
    failed(sim, f"no progress: worker b[0] (rank 1) was given up {REPEATS} times in a row at commit 6, its process "
                f"still running each time", f"what it was doing: {doing}; {remedy}")
    assert "\n" not in sim.outcome.reason
    other = "--heartbeat-timeout" if how == "deadlock" else "--progress-timeout"
    assert other not in sim.outcome.reason
    assert sim.slots_launched().count("b[0]") == REPEATS and sim.job.hosts.blacklist.for_good_slots() == []


def test_a_host_that_freezes_again_and_again_never_ends_a_healthy_fixed_size_job(caplog) -> None:
    """The reviewer's a1: rank 1's host freezes (a VM paused, its network down with the ssh session still open) for
    longer than --heartbeat-timeout, three times and more at commit 6. Its worker is given up as silent each time,
    but it never prints its stacks on the driver's signal (a frozen process runs no handler; a GIL-hung one does):
    that is not a hang of its script, and the job, relaunching it each time, goes on; a real GIL hang still counts
    from 1."""
    sim = fixed()
    for _ in range(REPEATS + 1):
        hangs(sim, "frozen", 6)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == REPEATS + 2
    assert "in a row at commit" not in caplog.text
    hangs(sim, "silent", 6)
    assert sim.outcome is None and caplog.text.count(f"1 of {REPEATS} in a row at commit 6") == 1, caplog.text


def test_a_healthy_worker_the_fast_rule_gives_up_never_counts_as_a_hang(caplog) -> None:
    """Review rv5 f1: rank 1 holds the GIL in one C call for 4 s (healthy), --heartbeat-timeout 60. The fast rule gives
    it up after ~1.5 s of silence while rank 0 waits for it, and it prints its stacks on the signal (it runs); it
    counted as a hang, and the third such give-up ended the job: "raise --heartbeat-timeout" though it was 60 s.
    Only a silence of the whole --heartbeat-timeout counts: the job relaunches it each time and goes on."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), progress_timeout_s=60, elastic_timeout_s=60,
                  heartbeat_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    for _ in range(REPEATS + 1):
        hangs(sim, "fast", 6)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == REPEATS + 2
    assert sum("(its limit" in s.reason for s in sim.stops) == REPEATS + 1, [s.reason for s in sim.stops]
    assert "in a row at commit" not in caplog.text


@pytest.mark.parametrize("how, said", [("thaw", "heartbeated again before its kill"),
                                       ("cut", "its link to the driver was cut")])
def test_a_worker_given_up_for_silence_that_was_not_hung_never_counts(caplog, how, said) -> None:
    """Review rv5 f2 (``thaw``): rank 1's host frozen past --heartbeat-timeout, thawed within the second between the
    stacks signal and the kill: the pending signal runs at the thaw and it prints its stacks, but its heartbeat
    thread wakes too and a heartbeat arrives before the kill (a GIL-hung process cannot send one). All three counted
    and the job ended naming a time.sleep line; a heartbeat after the give-up now means it was not hung.
    A later review (``cut``) cut rank 1's link to the driver alone (a proxy on the control port): it printed its
    stacks, its main thread waiting on the driver in cloud-elastic's own link, and that counted as a hang of its
    script ("silent (holding the GIL?)"). Neither counts now; a real GIL hang still counts from 1."""
    caplog.set_level("INFO", logger="cloud_elastic.driver.job.failures")
    sim = fixed()
    for _ in range(REPEATS + 1):
        hangs(sim, how, 6)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == REPEATS + 2
    assert "in a row at commit" not in caplog.text and said in caplog.text
    hangs(sim, "silent", 6)  # a GIL hang still counts from 1
    assert sim.outcome is None and caplog.text.count(f"1 of {REPEATS} in a row at commit 6") == 1, caplog.text


def test_a_gil_hang_of_a_worker_whose_stacks_signal_is_not_armed_still_ends_the_job() -> None:
    """Review rv5 h1: the script installs its own SIGUSR1 handler (a 'checkpoint on USR1' handler), so faulthandler
    never answers the driver's signal; its GIL hang was given up 15 times, "not counted", until SIGINT. A worker that
    says its stacks signal is not armed counts on its silence alone (the whole --heartbeat-timeout, no heartbeat
    before its kill), and the third give-up ends the job, saying why it names no frame."""
    sim = fixed()
    for n in range(1, REPEATS + 1):
        hangs(sim, "unarmed", 6)
        assert (sim.outcome is None) == (n < REPEATS), n
        assert not sim.stops[-1].stacks  # no SIGUSR1: it would run the script's handler (whose I/O lets a beat out)
    failed(sim, f"was given up {REPEATS} times in a row at commit 6", "silent (holding the GIL?), its stacks not asked "
           "for (no stacks signal armed in its process); raise --heartbeat-timeout")


def test_the_workers_of_one_host_given_up_in_two_scans_count_once(caplog) -> None:
    """The reviewer's a2: the three workers of one host hang together (each holding the GIL) and are given up a
    second apart, in two scans of the driver; one outage, counted once ("workers given up together count once"),
    not 2 of 3 toward the job's end."""
    sim = started(4, {"a": 1, "b": 3}, min_np=1, cooldown=(1.0, 2.0), progress_timeout_s=5, elastic_timeout_s=60)
    host = [sim.id(f"b[{i}]") for i in range(3)]
    for slot in ("a[0]", "b[0]", "b[1]", "b[2]"):
        at_commit(sim, slot, 6)
    sim.silent.add(host[0])
    sim.advance(1.0)
    sim.silent.update(host[1:])
    gone_at: dict[str, float] = {}
    for _ in range(40):
        sim.advance(0.5)
        gone_at.update((b, sim.now) for b in host if b not in gone_at and not sim.job.workers[b].alive)
        if len(gone_at) == len(host):
            break
    assert len(set(gone_at.values())) >= 2, gone_at  # given up in more than one scan
    for b in host:
        signalled(sim, b, printed=True)
        sim.advance(0.5)
    assert sim.outcome is None
    assert caplog.text.count(f"1 of {REPEATS} in a row at commit 6") == 1, caplog.text
    assert f"2 of {REPEATS}" not in caplog.text, caplog.text


@pytest.mark.parametrize("status", [KILLED, UNREACHABLE], ids=["SIGKILL-from-outside", "ssh-session-closed"])
def test_a_host_that_stops_answering_never_counts_toward_the_end(status) -> None:
    """The worker's process ended before the driver gave it up (killed from outside, its host out of reach): not a
    hang. Two hangs, then its host lost again and again at the same commit, still relaunched; a third hang ends it."""
    sim = fixed()
    for how in ["deadlock", "deadlock"] + [status] * REPEATS:
        hangs(sim, how, 6)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == REPEATS + 3
    hangs(sim, "silent", 6)
    failed(sim, f"was given up {REPEATS} times in a row at commit 6")


def test_a_commit_between_hangs_starts_the_count_again() -> None:
    sim = fixed()
    hangs(sim, "deadlock", 6)
    hangs(sim, "silent", 6)
    at_commit(sim, "a[0]", 7)  # the job trained one commit further
    at_commit(sim, "b[0]", 7)
    hangs(sim, "deadlock", 7)
    hangs(sim, "silent", 7)
    assert sim.outcome is None
    hangs(sim, "deadlock", 7)
    failed(sim, f"was given up {REPEATS} times in a row at commit 7")


def test_an_elastic_job_whose_survivor_trains_on_never_ends_for_a_worker_that_hangs_each_time(caplog) -> None:
    """-np 2 --min-np 1: rank 0 commits alone after each give-up; the hanging slot keeps its growing cooldown and the
    job goes on. Each give-up is counted (and said) as the first at a new commit."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, cooldown=(1.0, 2.0), progress_timeout_s=5, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    for n in range(2 * REPEATS):
        hangs(sim, "deadlock", 6 + n, survivor_commits=True)
    assert sim.outcome is None and sim.slots_launched().count("b[0]") == 2 * REPEATS + 1
    assert sim.job.hosts.blacklist.for_good_slots() == []
    assert caplog.text.count(f"1 of {REPEATS} in a row at commit") == 2 * REPEATS, caplog.text


# ------------------------------------------------------------------ a stall loop
def stalls(flights: list[FlightEntry | None], times: int,
           each_round: Callable[[FakeJob, int], None] = lambda job, n: None) -> FakeJob:
    """A round of two on a[0] and a[1] at commit 6 stalls ``times`` times in a row, re-forming with the same two
    after each abort; each time rank i last reported ``flights[i]`` (with the round's number) as it stalled, and
    ``each_round(job, n)`` ran first (what the ``n``-th round committed). Stops early once the job has ended."""
    job = FakeJob(2, progress_timeout_s=60)
    job.phase, job.round, job.commit_high = Phase.RUNNING, 1, 6
    workers = [job.worker("a", i, S.RUNNING, round_=1, rank=i) for i in range(2)]
    job.silence = SilenceWatch(10.0, 60.0)
    completion = Completion(job, lambda: workers[0])
    now = T0
    for n in range(1, times + 1):
        each_round(job, n)
        completion.round_formed(now)
        for w, f in zip(workers, flights):  # heartbeating: nobody is missing, nobody progresses
            if f is not None:
                job.silence.heard(w.worker_id, now, FlightEntry(job.round, f.seq, f.op, f.state, 0.0))
        now += 61
        completion.check_progress(now)
        for w in workers:
            w.stacks_sent = w.stacks_wanted
        now += STACKS_WAIT_S
        completion.check_progress(now)
        if job.outcome is not None:
            break
        assert job.aborts == n
        job.round += 1  # the same two re-form
        for w in workers:
            w.round = job.round
    return job


def test_a_round_that_stalls_again_at_the_same_commit_with_the_same_members_ends_naming_the_collective() -> None:
    allreduce = FlightEntry(1, 14, "allreduce", "entered", 0.0)  # both wait in the same allreduce
    job = stalls([allreduce, allreduce], REPEATS)
    assert job.aborts == REPEATS - 1
    reason = job.outcome.reason
    assert not job.outcome.success and job.outcome.exit_code == 1
    assert f"round 3 stalled {REPEATS} times in a row at commit 6 with the same 2 worker(s)" in reason
    assert "rank 0 collective #14 (allreduce) waiting in it; rank 1 collective #14 (allreduce)" in reason


@pytest.mark.parametrize("rank1", [FlightEntry(1, 2, "broadcast", "completed", 0.0), None],
                         ids=["past-its-last-collective", "no-collective-yet"])
def test_a_straggler_busy_outside_any_collective_stalls_again_and_again_without_ending_the_job(rank1) -> None:
    """The reviewer's c2: rank 1's step takes longer than --progress-timeout the first times (slow storage warming
    up); rank 0 waits in the allreduce while rank 1 is still heartbeating outside any collective: not a mismatch,
    each stall only aborts its round."""
    job = stalls([FlightEntry(1, 3, "allreduce", "entered", 0.0), rank1], REPEATS + 1)
    assert job.outcome is None and job.aborts == REPEATS + 1


def test_a_stall_after_progress_is_a_new_count() -> None:
    job = FakeJob(2, progress_timeout_s=60)
    job.phase, job.round = Phase.RUNNING, 1
    workers = [job.worker("a", i, S.RUNNING, round_=1, rank=i) for i in range(2)]
    completion = Completion(job, lambda: workers[0])
    now = T0
    for n in range(2 * REPEATS):
        job.commit_high = n // (REPEATS - 1)  # a commit past the stall every REPEATS - 1 stalls
        completion.round_formed(now)
        now += 61
        completion.check_progress(now)
        now += STACKS_WAIT_S + 1
        completion.check_progress(now)
        job.round += 1
        for w in workers:
            w.round = job.round
    assert job.outcome is None and job.aborts == 2 * REPEATS


# ------------------------------------------------------- the frame a GIL hang printed
def _block(header: str, frames: list[str]) -> str:
    return "\n".join([header] + [f'  File "{f[0]}", line {f[1]} in {f[2]}' for f in frames])


_MAIN_HUNG = [("/usr/lib/python3.11/re/__init__.py", 166, "match"), ("/job/t5.py", 30, "regex"),
              ("/job/t5.py", 56, "train"), ("/job/t5.py", 66, "<module>")]
#: Real faulthandler text on the signal, as the worker prints it: a thread inside a lazy import (its module's top
#: level runs a ``<module>`` frame, listed first: the newest thread) while the main thread holds the GIL.
IMPORT_THREAD = "\n\n".join([
    _block("Thread 0x00007f1 (most recent call first):", [
        ("/job/slowmod.py", 3, "<module>"), ("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
        ("/job/t5.py", 50, "<lambda>")]),
    _block("Current thread 0x00007f0 (most recent call first):", _MAIN_HUNG)]) + "\n"
#: The main thread deeper than 100 frames: faulthandler cuts it with ``  ...`` and no ``<module>`` is shown.
DEEP = _block("Current thread 0x00007f0 (most recent call first):",
              _MAIN_HUNG[:2] + [("/job/t5.py", 33, "deep")] * 98) + "\n  ...\n"
#: More than 100 threads (a loader's pool): faulthandler lists 100, the newest, and ends with ``...``.
POOL = "\n\n".join([_block(f"Thread 0x{i:012x} (most recent call first):", [("/usr/lib/python3.11/threading.py", 324,
                                                                           "wait")]) for i in range(100)] + ["..."])


@pytest.mark.parametrize("printed, doing", [
    (IMPORT_THREAD, 'its main thread at "/usr/lib/python3.11/re/__init__.py", line 166 in match'),
    (DEEP, 'its main thread at "/usr/lib/python3.11/re/__init__.py", line 166 in match'),
    (POOL, "its main thread's frame unknown"),
], ids=["thread-in-a-lazy-import", "deeper-than-100-frames", "more-than-100-threads"])
def test_the_end_line_names_the_frame_the_main_thread_printed_on_the_signal_or_says_it_is_unknown(
        monkeypatch, printed, doing) -> None:
    """Review rv5 p1: the text printed on the signal carries no main-thread mark, so the end line took the first block
    with a ``<module>`` frame: a thread inside a lazy import was named, and a main thread deeper than 100 frames or
    behind 100 other threads gave no frame. ``faulthandler``'s handler runs on the main thread for a signal sent to
    the process, so its ``Current thread`` block is the main thread's, when every thread was listed."""
    monkeypatch.setitem(globals(), "PRINTED", printed)
    sim = fixed()
    for _ in range(REPEATS):
        hangs(sim, "silent", 6)
    failed(sim, f"was given up {REPEATS} times in a row at commit 6", f"silent (holding the GIL?), {doing}; raise")



@pytest.mark.parametrize("wrapped", [False, True], ids=["own", "bash-wrapped"])
def test_a_worker_says_whether_it_prints_its_stacks_on_the_signal(monkeypatch, wrapped) -> None:
    """What a worker tells the driver at registration and with each heartbeat: armed while faulthandler holds SIGUSR1
    and it is the process the launcher signals (its group's leader); not once its script sets its own handler (after
    hvd.init(), as rv5's h1 script does), and never under a wrapper script (the wrapper gets the signal)."""
    import faulthandler
    import os
    import signal

    from cloud_elastic.worker.link.driver_link import stacks_signal_armed

    monkeypatch.setattr(os, "getpgid", lambda pid: os.getpid() + (1 if wrapped else 0))
    before = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)  # as the worker library does at start
        armed = stacks_signal_armed()
        signal.signal(signal.SIGUSR1, lambda s, f: None)  # the script's own 'checkpoint on USR1' handler
        assert (armed, stacks_signal_armed()) == (not wrapped, False)
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, before if before is not None else signal.SIG_DFL)


def test_the_heartbeat_carries_the_stacks_signal_and_an_older_workers_carries_none() -> None:
    from cloud_elastic.protocol import PollRequest

    wire = PollRequest(1, 0, 0, stacks_signal=False).to_wire()
    assert PollRequest.from_wire(wire).stacks_signal is False
    del wire["stacks_signal"]
    assert PollRequest.from_wire(wire).stacks_signal is None  # an older worker: taken as armed, as before


def test_one_outage_of_a_host_whose_workers_wait_outside_any_round_counts_once(caplog) -> None:
    """Review rv12 n4: a host's three workers, registered but not yet in a round (waiting for the first one, as
    newcomers and spares wait), and unarmed (a wrapper, Ray, Spark: counted on their silence alone), freeze once
    together. Each counted on its own ("1 of 3", "2 of 3", then the end) and one outage of one host ended a healthy
    job; outside a round, workers given up together count once per host."""
    sim = Sim(4, min_np=4, cooldown=(1.0, 2.0), progress_timeout_s=5, elastic_timeout_s=60)
    sim.discover({"a": 1, "b": 3})
    for slot in ("a[0]", "b[0]", "b[1]", "b[2]"):
        assert sim.job.registered(sim.id(slot), sim.now)
    host = [sim.id(f"b[{i}]") for i in range(3)]
    for b in host:
        sim.job.workers[b].stacks_signal = False
    sim.silent.update(host)
    for _ in range(60):
        sim.advance(0.5)
        if not any(sim.job.workers[b].alive for b in host):
            break
    assert not any(sim.job.workers[b].alive for b in host)
    for b in host:
        signalled(sim, b, printed=False)
    assert sim.outcome is None, sim.outcome
    assert f"2 of {REPEATS}" not in caplog.text, caplog.text
