"""The lanes' order: each jobs-lane worker starts with its share of the longest tests, and the fast lane
with its longest files (:func:`files_first`).

``--dist worksteal`` hands each worker a contiguous share of the collection (by count), and a
worker that runs out steals from the end of the longest queue. In collection order the longest
tests (a chaos run of 100 s, driver restarts of a minute, the SSH grace) came in the last
third: one worker ran them one after another while the others had finished, and a fresh
clone's jobs lane was 70 % done at 401 s and ended at 653 s.

``scripts/run_tests.py`` loads this plugin in the jobs lane (``-p tests.lane_order``). It
reorders the collection so that each worker's share begins with its part of :data:`LONGEST`
(assigned longest first to the share with the least so far), followed by other tests in
collection order up to the share's count; what the workers steal from the ends of the queues
is then short. Only the order changes: every test runs, under the same options. A test not
listed counts as short; a listed one that no longer exists is ignored.
"""

from __future__ import annotations

import os

import pytest

#: Seconds per test, from ``--durations`` of the jobs lane in a full run (2026-11-27, 2-core machine; the last five
#: from a loaded run on 2026-11-29, where the early-return test, unlisted, came third). The tests made shorter on
#: 2026-11-30 keep their figure times the ratio of their new to their old duration, measured side by side (HEAD
#: and the change, ``-n 2`` each, on the same loaded machine): the figures stay comparable with one another. So do
#: those of test_silence's stopped worker and test_slow_link, shortened later that day (each alone, HEAD then the
#: change: 22.4 -> 10.9 s and 20.5 -> 17.0 s).
LONGEST = {
    "tests/integration/test_early_return_backoff.py::test_a_newcomer_whose_sampler_runs_short_backs_off_with_growing_cooldowns": 42,
    "tests/integration/test_silence.py::test_a_worker_stopped_during_a_collective_is_named_before_its_round_is_aborted": 9,
    "tests/integration/test_slow_link.py::test_a_worker_slow_only_in_its_sends_and_receives_is_drained_as_a_slow_network_and_the_others_are_not": 21,
    "tests/integration/test_sharded_checkpoint.py::test_a_sharded_job_that_lost_every_host_resumes_from_its_dcp_checkpoint_and_a_job_of_one_slot_reshards_it": 24,
    "tests/ssh/test_ssh_e2e.py::test_removing_a_host_stops_its_remote_worker": 24,
    "tests/chaos/test_chaos.py::test_chaos_schedule": 91,
    "tests/ssh/test_ssh_driver_grace.py::test_remote_workers_outlive_a_killed_driver_for_the_grace_only_then_the_job_resumes": 53,
    "tests/integration/test_driver_restart.py::test_a_driver_restarted_without_the_local_record_waits_for_the_old_workers_first": 50,
    "tests/integration/test_driver_restart.py::test_a_driver_restarted_before_any_checkpoint_resumes_from_what_the_old_workers_wrote_meanwhile": 61,
    "tests/integration/test_events_demo.py::test_demo_records_its_events_and_draws_its_timeline": 22,
    "tests/integration/test_driver_restart.py::test_a_killed_driver_is_resumed_by_the_same_command_and_no_worker_outlives_the_grace": 42,
    "tests/integration/test_group_reclaim.py::test_thirty_lost_peers_leave_threads_and_descriptors_flat": 36,
    "tests/ssh/test_ssh_driver_adoption.py::test_a_restarted_driver_adopts_remote_workers_and_nothing_is_left": 33,
    "tests/integration/test_driver_adoption.py::test_a_driver_restarted_within_the_grace_adopts_its_workers_and_loses_no_step": 36,
    "tests/integration/test_driver_adoption.py::test_a_worker_lost_while_the_driver_was_away_takes_the_normal_failure_path": 31,
    "tests/integration/test_remote_attach.py::test_an_attached_driver_keeps_the_worker_past_the_grace_and_its_loss_stops_it": 34,
    "tests/emulator/test_cli.py::test_run_with_aws_asg_trains_on_the_group_and_drains_a_terminating_instance": 33,
    "tests/integration/test_durable_s3.py::test_a_job_checkpoints_to_s3_through_a_failure_and_the_same_command_resumes_from_there": 32,
    # Three give-ups or stalls at --progress-timeout 5 each (2026-11-30, the file alone at -n 4 on the 2-core machine).
    "tests/integration/test_repeat_horovod_loop.py::test_a_rank_deadlocked_at_the_same_batch_of_horovods_loop_ends_the_job_at_its_third_give_up": 54,
    "tests/integration/test_repeat_horovod_loop.py::test_a_rank_stuck_each_relaunch_one_commit_further_trains_to_the_end": 38,
    "tests/integration/test_repeat_horovod_loop.py::test_a_collective_only_rank_0_runs_in_horovods_loop_ends_the_job_at_the_third_stall": 35,
    # Two SSH tests of the jobs lane unlisted till now: 22.3 and 11.5 s alone on a quiet machine (2026-11-30, where the
    # listed driver adoptions took 22.5 and 21.6 s for their 36 and 31), 48.4 and 35.3 s in the loaded run below.
    "tests/ssh/test_ssh_adopted_output.py::test_a_restarted_driver_shows_what_remote_workers_printed_while_it_was_away_and_after": 36,
    "tests/ssh/test_ssh_e2e.py::test_job_across_two_ssh_hosts_survives_kill_9_of_a_worker": 18,
    # The cloud-jobs lane's new driver restarts over moto (2026-11-30, a loaded clean-clone run at bc265aa: 23.8 and
    # 15.3 s), scaled by test_cli's figure over its time in that run (33 / 63.7): they are ordered among that lane's.
    "tests/emulator/test_multi_source.py::test_idle_raised_slots_show_in_status_and_their_cost_goes_on_across_a_driver_restart": 12,
    "tests/emulator/test_multi_source.py::test_a_forged_cost_in_the_sign_of_life_loses_no_group_raised_across_a_driver_restart": 8,
}


#: The fast lane's longest files, in seconds of one worker's time (``--durations=0`` of a loaded full run,
#: 2026-11-29: the order matters, not the figures). ``--dist loadfile`` hands out whole files in collection
#: order, and tests/kubernetes came last: its mutation file, the longest of all, started when the other
#: workers were nearly done and ended the lane alone.
LONGEST_FILES = {
    "tests/terraform/test_terraform_cli.py": 245,
    "tests/contract/test_contract.py": 218,
    "tests/emulator/test_aws_notices.py": 160,
    "tests/emulator/test_aws.py": 130,
    "tests/emulator/test_checkpoint_s3.py": 125,
    "tests/unit/test_in_place_commit.py": 109,
    "tests/unit/test_zero_copy_optimizers.py": 88,
    "tests/terraform/test_checkov.py": 74,
    "tests/unit/test_parsers_fuzz.py": 71,
    "tests/unit/test_round_group.py": 65,
    "tests/emulator/test_notice_watchers.py": 48,  # 65 until the fakes stopped in 0.05 s (c50776f: 59 -> 44 s alone)
    "tests/emulator/test_gcp.py": 64,
    "tests/kubernetes/test_mutations.py": 60,  # 316 until its schema checks were cached (f63defb)
    "tests/unit/test_checkpoint_forged_bounds.py": 35,  # new 2026-11-30: two of its tests 30 s in a loaded run
}


def files_first(nodeids: list[str], longest: dict[str, float] = LONGEST_FILES) -> list[int]:
    """The new order of ``nodeids`` (as indices): the files of ``longest``, longest first, then the rest in
    collection order; each file's tests stay together and in their order (``loadfile`` runs a file on one worker)."""
    def file_of(i: int) -> str:
        return nodeids[i].split("::", 1)[0]

    listed = sorted({file_of(i) for i in range(len(nodeids)) if file_of(i) in longest}, key=lambda f: -longest[f])
    rank = {f: k for k, f in enumerate(listed)}
    return sorted(range(len(nodeids)), key=lambda i: (rank.get(file_of(i), len(listed)), i))


def shares(count: int, workers: int) -> list[int]:
    """How many tests each worker gets first: xdist's worksteal splits ``count`` as this does."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def reorder(nodeids: list[str], workers: int, longest: dict[str, float] = LONGEST) -> list[int]:
    """The new order of ``nodeids`` (as indices) for ``workers`` workers (see the module docstring)."""
    sizes = shares(len(nodeids), workers)
    long_ones = sorted((i for i, n in enumerate(nodeids) if n in longest), key=lambda i: -longest[nodeids[i]])
    heads: list[list[int]] = [[] for _ in sizes]
    load = [0.0] * len(sizes)
    for i in long_ones:
        # The share with the least long work so far that still has room.
        k = min((k for k in range(len(sizes)) if len(heads[k]) < sizes[k]), key=lambda k: load[k])
        heads[k].append(i)
        load[k] += longest[nodeids[i]]
    chosen = set(long_ones)
    rest = iter(i for i in range(len(nodeids)) if i not in chosen)
    order: list[int] = []
    for head, size in zip(heads, sizes):
        order += head
        order += [next(rest) for _ in range(size - len(head))]
    return order


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each xdist worker collects, and the controller schedules the order they report (they must agree:
    # this order depends on the node ids alone). Outside xdist (one process) the order does not matter.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    nodeids = [item.nodeid for item in items]
    order = files_first(nodeids) if config.getoption("dist", "no") == "loadfile" else reorder(nodeids, workers)
    items[:] = [items[i] for i in order]
