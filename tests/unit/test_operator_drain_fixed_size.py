"""``cloud-elastic drain``: the reply says what the job then does (review s57 rvD F1-F3).

* A script without ``hvd.elastic.run`` cannot leave at a commit: while no worker has entered it, a drained worker
  runs to the end of the script with the others, on a fixed ``-H`` list as with discovery, and the job neither
  ends nor waits for ``--min-np`` (before: a fixed list's job ended at once, every step lost; with discovery it
  failed past ``--elastic-timeout``). The reply says so, and what happens if the script enters it after all.
* The warning counts the workers that stay, a host with a soft notice included, and the free slots (before: the
  ready slots only, so a soft notice elsewhere made it warn of a wait that never came).
* Under ``--whole-hosts`` it counts whole hosts, as launches do (before: single slots, and no warning while the
  job dropped to 0 workers).
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Finish, WorkerState
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, Sim, failed, started
from tests.unit.test_job_fixed_size import script_ends

pytestmark = pytest.mark.timeout(30)

S = WorkerState
# The driver cannot tell yet whether the script is fixed-size, so the reply says both (review s58 rvH F3).
FIXED_SIZE_NOTE = (" to the end of the script with the others if it never does (none has entered it yet; a fixed-size "
                   "script cannot leave at a commit)")
HOST_NOTE = ("its 1 worker(s) leave at their first commit if the script enters hvd.elastic.run, or "
             f"run{FIXED_SIZE_NOTE}")
ENDS = ("that leaves 1 slot(s), below --min-np 2, and a fixed -H list cannot grow: the job ends once its workers "
        "have left (its newest commit written first with --checkpoint-dir)")


def _two_hosts(hosts_fixed: bool) -> Sim:
    """-np 2 (--min-np 2) on a[0] and b[0], no worker in hvd.elastic.run yet (a plain Horovod script, so far)."""
    return started(2, {"a": 1, "b": 1}, elastic_timeout_s=300, hosts_fixed=hosts_fixed,
                   progress_timeout_s=0)  # the steps are not played


@pytest.mark.parametrize("hosts_fixed", [True, False], ids=["fixed-list", "discovery"])
def test_a_drained_worker_of_a_fixed_size_script_runs_to_its_end_as_the_reply_says(hosts_fixed: bool) -> None:
    sim = _two_hosts(hosts_fixed)
    done, message = sim.job.drain("b", None, sim.now)
    assert done
    assert message.startswith(f"host b drains: {HOST_NOTE}; no new "
                              "worker is placed there until it leaves discovery; WARNING: if the script enters "
                              "hvd.elastic.run, that leaves ")
    assert message.endswith(ENDS if hosts_fixed else "room for 1 worker(s), below --min-np 2: the job waits for more "
                                                     "up to --elastic-timeout (300s), then fails")
    sim.advance(400)  # past --elastic-timeout
    assert sim.outcome is None and sim.job.workers[sim.id("b[0]")].state is S.DRAINING
    script_ends(sim, "b[0]")
    script_ends(sim, "a[0]")
    assert sim.outcome == Finish(True, "training completed on 2 worker(s), every one exiting 0 (a fixed-size job: "
                                       "no worker entered hvd.elastic.run)", 0)


def test_a_drained_slot_of_a_fixed_size_script_says_so_too() -> None:
    sim = started(2, {"a": 2}, hosts_fixed=True)
    done, message = sim.job.drain("a", 1, sim.now)
    assert done and message.startswith(f"worker {sim.id('a[1]')} leaves at its first commit if the script enters "
                                       f"hvd.elastic.run, or runs{FIXED_SIZE_NOTE}; slot "
                                       "a[1] blacklisted")
    sim.advance(30)
    assert sim.outcome is None


def test_once_the_script_enters_elastic_run_the_drained_worker_leaves_and_the_fixed_list_ends_as_warned() -> None:
    sim = _two_hosts(True)
    assert sim.job.drain("b", None, sim.now)[1].endswith(ENDS)
    sim.job.fixed.entered(sim.id("a[0]"))
    sim.join("a[0]", reason="update")
    sim.join("b[0]", reason="update")
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    failed(sim, "1 worker(s) ready and 1 slot(s) left for --min-np 2", "b drained by an operator")


def _soft_notice_on_b_then_drain_c(hosts_fixed: bool) -> tuple[Sim, str]:
    sim = started(2, {"a": 1, "b": 1, "c": 1}, elastic_timeout_s=300, hosts_fixed=hosts_fixed,
                  progress_timeout_s=0)  # the steps are not played
    sim.job.fixed.entered(sim.id("a[0]"))
    assert sorted(str(w.slot) for w in sim.job.members()) == ["a[0]", "b[0]"]
    sim.job.notice("b", Drain(None, "EC2 rebalance recommendation"), sim.now, source="aws-imds", soft=True)
    assert "b" in sim.job.hosts.soft and sim.job.workers[sim.id("b[0]")].state is S.RUNNING
    done, message = sim.job.drain("c", None, sim.now)
    assert done
    return sim, message


@pytest.mark.parametrize("hosts_fixed", [True, False], ids=["fixed-list", "discovery"])
def test_a_worker_on_a_host_with_a_soft_notice_counts_as_staying(hosts_fixed: bool) -> None:
    """Before: 'that leaves 1 ready slot(s) ... and 1 more ... on a host with a notice: the job waits ... then fails'
    while b[0] trained on and the job never waited."""
    sim, message = _soft_notice_on_b_then_drain_c(hosts_fixed)
    assert message == ("host c drains: its 0 worker(s) leave at their next commit; no new worker is placed there "
                       "until it leaves discovery")
    for _ in range(80):  # past --elastic-timeout
        sim.advance(5)
        if not hosts_fixed:
            sim.discover({"a": 1, "b": 1, "c": 1})
    assert sim.outcome is None and sorted(str(w.slot) for w in sim.job.members()) == ["a[0]", "b[0]"]


def test_a_drain_that_leaves_room_for_too_few_still_warns_with_a_soft_notice_elsewhere() -> None:
    sim, _ = _soft_notice_on_b_then_drain_c(False)
    done, message = sim.job.drain("a", None, sim.now)
    assert done and message.endswith("; WARNING: that leaves room for 1 worker(s), below --min-np 2: the job waits "
                                     "for more up to --elastic-timeout (300s), then fails")


def test_under_whole_hosts_the_warning_counts_whole_hosts_as_launches_do() -> None:
    """Before: b[1] and c[1] were free while b[0] and c[0] cooled down, two single slots for --min-np 2, so the reply
    said nothing while the job dropped to 0 workers for a minute."""
    sim = started(6, {"a": 2, "b": 2, "c": 2}, min_np=2, max_np=6, cooldown=(60.0, 60.0), hosts_fixed=True,
                  whole_host_slots=2, elastic_timeout_s=300)
    sim.job.fixed.entered(sim.id("a[0]"))
    for host in ("b", "c"):
        assert "WARNING" not in sim.job.drain(host, 0, sim.now)[1]
    sim.join("a[0]", "a[1]", reason="update")
    for slot in ("b[0]", "b[1]", "c[0]", "c[1]"):
        sim.join(slot, reason="update")
        sim.exit(slot, CLEAN)
    sim.advance(1)
    done, message = sim.job.drain("a", None, sim.now)
    assert done and message.endswith("; WARNING: that leaves room for 0 worker(s), below --min-np 2, and 4 more "
                                     "slot(s) cooling down after a failure or on a host with a notice: the job "
                                     "waits for them up to --elastic-timeout (300s), then fails")
    launched = len(sim.launched)
    sim.join("a[0]", "a[1]", reason="update")
    for slot in ("a[0]", "a[1]"):
        sim.exit(slot, CLEAN)
    for _ in range(70):
        sim.advance(1)
    assert sim.outcome is None and sorted(sim.slots_launched()[launched:]) == ["b[0]", "b[1]", "c[0]", "c[1]"]


# ------------------------------------------- a drain during set-up (review s57 rvG F2 of 8aaf449)
# setup_drain.sh: a plain Horovod script with 10 s of set-up before hvd.init(), fixed -H of two hosts, `cloud-elastic
# drain JOB 127.0.0.3` during the set-up: the reply said the drained worker runs to the end of the script with the
# others, and the job then stopped it and ended rc 1 "1 worker(s) ready and 1 slot(s) left for --min-np 2". A worker
# not yet in a round is stopped (or, waiting at rendezvous, told to exit), fixed-size script or not: the reply says so,
# and its warning is not "if the script enters hvd.elastic.run" when the job is short without it already.
IN_SETUP = "its 1 worker(s) not yet in a round leave now (stopped in their set-up, or told to exit at rendezvous)"


def _in_setup(hosts_fixed: bool) -> Sim:
    sim = Sim(2, elastic_timeout_s=300, hosts_fixed=hosts_fixed)
    sim.discover({"a": 1, "b": 1})
    assert sim.slots_launched() == ["a[0]", "b[0]"]  # both still in their set-up, before hvd.init()
    return sim


def test_a_drain_during_set_up_on_a_fixed_list_says_the_worker_is_stopped_and_the_job_ends() -> None:
    sim = _in_setup(True)
    done, message = sim.job.drain("b", None, sim.now)
    assert done and "run to the end of the script" not in message and "if the script enters" not in message, message
    assert message == (f"host b drains: {IN_SETUP}; no new worker is placed there until it leaves discovery; "
                       f"WARNING: {ENDS}")
    sim.advance(0.5)
    assert sim.id("b[0]") in [s.worker_id for s in sim.stops]
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    failed(sim, "1 worker(s) ready and 1 slot(s) left for --min-np 2", "b drained by an operator")


def test_a_drain_during_set_up_with_discovery_says_the_job_waits_for_more() -> None:
    sim = _in_setup(False)
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message == (f"host b drains: {IN_SETUP}; no new worker is placed there until it leaves discovery; "
                                "WARNING: that leaves room for 1 worker(s), below --min-np 2: the job waits for more "
                                "up to --elastic-timeout (300s), then fails")


def test_a_drained_slot_during_set_up_says_it_leaves_now() -> None:
    sim = Sim(2, hosts_fixed=True)
    sim.discover({"a": 2})
    done, message = sim.job.drain("a", 1, sim.now)
    assert done and message.startswith(f"worker {sim.id('a[1]')}, not yet in a round, leaves now (stopped in its "
                                       "set-up, or told to exit at rendezvous); slot a[1] blacklisted"), message


def test_draining_the_last_host_of_a_fixed_list_ends_the_job_as_the_reply_says() -> None:
    """Review h9 (2026-12-01): ``drain J b[0]`` then ``drain J a`` on ``-H a,b --min-np 1``: the reply said the job
    ends once its workers have left, but the holder of the state on a held on for a successor that a fixed list can
    never bring, and trained on without end."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, hosts_fixed=True)
    for slot in ("a[0]", "b[0]"):
        sim.job.fixed.entered(sim.id(slot))
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    sim.job.drain("b", None, sim.now)
    sim.commit("a[0]", "b[0]")
    sim.join("a[0]", "b[0]", reason="update")  # b leaves at the commit; a goes on alone
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    done, message = sim.job.drain("a", None, sim.now)
    assert done and "a fixed -H list cannot grow: the job ends once its workers have left" in message, message
    sim.commit("a[0]")
    sim.advance(1)
    assert sim.job.workers[sim.id("a[0]")].state in (S.DRAINING, S.EXITING), sim.job.workers[sim.id("a[0]")].state
    sim.join("a[0]", reason="update")  # it leaves at its commit
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None, "the job trained on after the reply said it ends"
