"""Two GPUs, NCCL: a peer lost in the middle of an allreduce; the survivor aborts, re-forms and restores bitwise.

On one host NCCL sees a dead peer late or never (its kernels wait on the peer's
GPU memory), so the survivor is released by the driver's round abort: the
heartbeat thread learns of it and aborts the round's communicator
(``rounds.on_device``), the survivor's wait for the device ends, its update and
commit after the abort are refused (``confirm_on_device``), the device is
quiesced, and the worker rolls back and joins the next round on a new
communicator. These tests need two visible GPUs and are skipped otherwise.
"""

from __future__ import annotations

import pytest

from tests.gpu.support import by_pid, commit_checksums, env, probe, timed_events

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2), pytest.mark.timeout(180)]

#: Far below the collective timeout (300 s): only the abort can have released the survivor this fast.
RECOVERY_BOUND_S = 30.0


def _check_bitwise_and_done(job) -> dict[int, set[str]]:
    committed = commit_checksums(job)
    assert all(len(sums) == 1 for sums in committed.values()), {s: c for s, c in committed.items() if len(c) > 1}
    for e in job.of("resumed"):
        if e["step"] > 0:
            assert e["checksum"] in committed[e["step"]], e
    done = job.of("done")
    assert len(done) == 2 and {e["size"] for e in done} == {2} and len({e["checksum"] for e in done}) == 1, done
    hellos = job.of("hello")
    assert {e["backend"] for e in hellos} == {"nccl"}, hellos
    assert {e["slot"][-1] + ":" + e["device"] for e in hellos} == {"0:cuda:0", "1:cuda:1"}, hellos
    return committed


def _recovery_s(job, dying) -> float:
    """From the death's line to the survivor's first line of the next round."""
    [(died_at, _)] = timed_events(job, "dying", pid=dying["pid"], point=dying["point"])
    survivor = [(t, e) for t, e in timed_events(job, "resumed", slot="127.0.0.1/0") if e["round"] > dying["round"]]
    assert survivor, job.output()
    return survivor[0][0] - died_at


def test_a_peer_killed_in_an_nccl_allreduce_and_later_after_its_update(jobs, tmp_path, gpu_report):
    once = tmp_path / "once"
    once.mkdir()
    # Slot 1 dies twice: in backward (the survivor waits in the step's gradient allreduce), then, as its
    # replacement, right after its update (the survivor is past its own update, in the logging allreduce,
    # and only its kept commit brings it back). Each time a replacement joins: 4 resets.
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:2", "--blacklist-cooldown-range", "1", "1",
                "--elastic-timeout", "60",
                *probe("--steps", "30", "--min-resets", "4", "--tail-steps", "5", "--log-every", "1",
                       "--step-sleep", "0.05", "--die", "127.0.0.1/1,backward,10,2", "--die", "127.0.0.1/1,update,10,2",
                       "--once-dir", str(once))], env=env())
    assert job.finish(170) == 0, job.output()
    committed = _check_bitwise_and_done(job)
    deaths = {e["point"]: e for e in job.of("dying")}
    assert set(deaths) == {"backward", "update"}, deaths
    for point, dying in deaths.items():
        recovery = _recovery_s(job, dying)
        gpu_report(f"peer killed at {point} of step {dying['step']}: survivor in its next round after {recovery:.1f} s")
        assert recovery < RECOVERY_BOUND_S
    # After the second death the survivor's own update of that step was undone by the restore.
    k = deaths["update"]["step"]
    survivor = by_pid([e for e in job.events if e["slot"] == "127.0.0.1/0"])
    [events] = survivor.values()
    windows = [e for e in events if e.kind == "window" and e["step"] == k]
    after = [e for e in events if e.kind == "resumed" and e["round"] > deaths["update"]["round"]]
    assert windows and windows[0]["checksum"] not in committed[k], windows
    assert after and after[0]["step"] == k and after[0]["checksum"] in committed[k], after


def test_a_peer_stopped_in_an_nccl_allreduce_is_given_up_and_the_survivor_goes_on(jobs, tmp_path, gpu_report):
    once = tmp_path / "once"
    once.mkdir()
    # SIGSTOP: no socket closes, nothing fails; only the driver's heartbeat timeout finds it.
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:2", "--blacklist-cooldown-range", "1", "1",
                "--heartbeat-timeout", "3", "--elastic-timeout", "60",
                *probe("--steps", "30", "--min-resets", "2", "--tail-steps", "5", "--step-sleep", "0.05",
                       "--die", "127.0.0.1/1,stop-backward,10,2", "--once-dir", str(once))], env=env())
    assert job.finish(170) == 0, job.output()
    _check_bitwise_and_done(job)
    [dying] = job.of("dying")
    recovery = _recovery_s(job, dying)
    gpu_report(f"peer stopped at step {dying['step']}: survivor in its next round after {recovery:.1f} s "
               "(heartbeat timeout 3 s)")
    assert recovery < RECOVERY_BOUND_S
