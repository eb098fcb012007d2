"""Sharded training at host granularity (``hvd.shard``): FSDP2 inside a host, replicas across hosts.

One job on loopback hosts with two slots each, 127.0.0.1 to 127.0.0.3 at first
(``tests/integration/shard_probe.py``: an MLP sharded across the host's two workers, AdamW, a
commit per step; each worker holds about half of the model). In sequence, each step asserted:

- ranks follow hosts side by side, local rank = slot (``--whole-hosts``); the replicas of shard
  *i* (local rank *i* of every host) are bitwise equal at every step;
- one worker of 127.0.0.3 dies between an update and its commit (while the others average the
  loss for the log): its host-mate leaves too, the host is blacklisted, and the workers of the
  two other hosts, which had updated, roll back to exactly their last commit's shards
  (parameters and AdamW state) and go on at size 4;
- discovery replaces the lost instance with 127.0.0.4: the new host joins whole as ranks 4 and
  5, and from its first commit its shards are bitwise equal to the other hosts' shards of the
  same local rank; they came point to point from 127.0.0.1, and 127.0.0.2 took no part (nor did
  any host after the failure, when both held the commit); ``cloud-elastic status`` shows the
  whole-host job;
- one worker of 127.0.0.4 dies as a step starts: its host-mate, left alone in FSDP2's all-gather
  over the host's own group, fails there and leaves too; the others roll back exactly;
- 127.0.0.2 is drained with ``cloud-elastic drain`` (as a spot notice drains it): both its
  workers leave at a commit, nobody rolls back, no round is aborted, and 127.0.0.1 finishes.

A second job takes a host out by a real spot notice (AWS's, from a fake instance metadata
service per loopback host): both its workers leave at one commit, the other host rolls back
nothing.

Merge (issue 25's rule): this test also holds every assertion of ``test_whole_hosts.py``'s
job (ranks side by side, a whole-host join, a killed worker taking its host out and
blacklisted, a drain by hand with zero rollback, the status line), which it replaces.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.harness import REPO, HostsFile
from tests.integration.test_status import runtime_dir, status  # noqa: F401 (runtime_dir is a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROBE = REPO / "tests" / "integration" / "shard_probe.py"


def _host(event) -> str:
    return event["worker"].split("[")[0]


def _replicas_agree(job) -> None:
    """Every commit's shard checksum equals every other host's for the same local rank and step."""
    seen: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for e in job.of("commit"):
        seen[(e["step"], e["local_rank"])][e["worker"]] = e["checksum"]
    for (step, local_rank), sums in seen.items():
        assert len(set(sums.values())) == 1, (step, local_rank, sums)


def _rolled_back_exactly(job, resets, size: int) -> None:
    """Each reset's shards (parameters and AdamW state) are those of the worker's last commit at ``size``."""
    for reset in resets:
        last = [e for e in job.of("commit", worker=reset["worker"]) if e["size"] == size][-1]
        assert (reset["step"], reset["checksum"]) == (last["step"], last["checksum"]), (reset, last)


def test_a_sharded_job_loses_a_host_heals_a_new_one_from_a_peer_and_drains_one_without_rollback(jobs, runtime_dir,
                                                                                                tmp_path):
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    stop, die = tmp_path / "stop", tmp_path / "die"
    hosts = HostsFile(tmp_path, ["127.0.0.1:2", "127.0.0.2:2", "127.0.0.3:2"])
    job = jobs(["run", "-np", "6", "--min-np", "2", "--max-np", "6", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.5", "--slots-per-host", "2", "--whole-hosts",
                "--blacklist-cooldown-range", "300", "300",
                sys.executable, str(PROBE), "--steps", "10", "--stop-when", str(stop),
                "--die-after-update", "127.0.0.3[1]:6", "--die-before-forward", f"127.0.0.4[0]:{die}"], env=env)
    hello = [job.wait_event("hello", rank=r) for r in range(6)]
    assert all(e["held"] < e["full"] * 0.6 for e in hello), hello  # each worker holds about half of the model
    assert [(e["rank"], _host(e), e["local_rank"], e["cross_rank"]) for e in hello] == [
        (0, "127.0.0.1", 0, 0), (1, "127.0.0.1", 1, 0), (2, "127.0.0.2", 0, 1), (3, "127.0.0.2", 1, 1),
        (4, "127.0.0.3", 0, 2), (5, "127.0.0.3", 1, 2)]
    # A failure: one worker of 127.0.0.3 dies right after its sixth update; the others had updated too and
    # were averaging the loss for the log. Its host-mate leaves, the others roll back exactly to step 5.
    job.wait_event("dying", step=6)
    job.wait_for(lambda j: any(e["size"] == 4 for e in j.of("commit")), timeout=60, what="two hosts training on")
    resets = [e for e in job.of("reset") if e["size"] == 4]
    assert sorted(_host(e) for e in resets) == ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"], resets
    _rolled_back_exactly(job, resets, size=6)
    # Both hosts hold that commit: no shard travels between them.
    # Each worker's lines come through a pipe of its own: one's 'entered' may be relayed after another's commit.
    job.wait_for(lambda j: len([e for e in j.of("entered") if e["size"] == 4]) >= 4, timeout=30,
                 what="the four workers of the round of two hosts entering")
    back = [e for e in job.of("entered") if e["size"] == 4]
    assert len(back) == 4 and not [e for e in back if e["sync_round"] == e["round"] and e["receivers"]], back

    # A new instance in its place: the new host joins whole and takes its shards from a peer host.
    hosts.set(["127.0.0.1:2", "127.0.0.2:2", "127.0.0.4:2"])

    def healed(j):
        """The new host's commits and the first host's at the same steps, for both local ranks."""
        new = {(e["step"], e["local_rank"]) for e in j.of("commit") if _host(e) == "127.0.0.4"}
        both = new & {(e["step"], e["local_rank"]) for e in j.of("commit") if _host(e) == "127.0.0.1"}
        first = min(step for step, _ in new) if new else None
        return new if {(first, 0), (first, 1)} <= both else None

    healed_at = job.wait_for(healed, timeout=120, what="the new host training beside the others")
    assert {e["size"] for e in job.of("commit") if _host(e) == "127.0.0.4"} == {6}, healed_at
    _replicas_agree(job)  # from its first commit on, the new host's shards are its peers' (and stay so)
    # Point to point: in the round that admitted it, only the new host (cross rank 2) received shards, each
    # local rank from 127.0.0.1's; 127.0.0.2 held that commit and took no part.
    admitted = {e["round"] for e in job.of("entered") if _host(e) == "127.0.0.4"}
    assert len(admitted) == 1, admitted
    that_round = [e for e in job.of("entered") if e["round"] in admitted]
    assert len(that_round) == 6 and {(e["sync_round"], tuple(e["receivers"])) for e in that_round} == {
        (admitted.pop(), (2,))}, that_round
    joined = sorted((e["rank"], e["local_rank"]) for e in job.of("hello") if _host(e) == "127.0.0.4")
    assert joined == [(4, 0), (5, 1)], joined
    shown = status(runtime_dir, job.job_id())
    assert shown.returncode == 0 and "(-np 6, --min-np 2, --max-np 6, whole hosts of 2 slot(s))" in shown.stdout, \
        shown.stdout + shown.stderr

    # A failure inside a host: one worker of 127.0.0.4 dies as a step starts, leaving its host-mate alone in
    # FSDP2's all-gather (the host's own group, which the driver cannot abort); it fails there and leaves too.
    resets_before = len(job.of("reset"))
    die.touch()
    job.wait_for(lambda j: len(j.of("reset")) - resets_before == 4, timeout=60, what="the rollback of the others")
    _rolled_back_exactly(job, job.of("reset")[resets_before:], size=6)
    job.wait_for(lambda j: re.search(r"worker 127\.0\.0\.4\[1\]#\d+ left \(worker 127\.0\.0\.4\[0\]", j.output()),
                 timeout=60, what="the host-mate to leave")
    assert re.search(r"<127\.0\.0\.4\[1\]> a collective of this host's group failed", job.output()), job.output()

    # A graceful leave: 127.0.0.2 drains at a commit, nobody rolls back.
    resets_before, lines_before = len(job.of("reset")), len(job.lines)
    drained = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "drain", job.job_id(), "127.0.0.2"],
                             cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and "host 127.0.0.2 drains" in drained.stdout, drained.stdout + drained.stderr
    job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")), timeout=60, what="the host left after the drain")
    stop.touch()
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "a host leaves whole (--whole-hosts)" in out and "host 127.0.0.3 blacklisted" in out, out
    after_drain = job.of("reset")[resets_before:]
    assert after_drain and all(e["executed"] == e["step"] for e in after_drain), after_drain  # zero rollback
    assert not [line for line in job.lines[lines_before:] if "aborted" in line], out
    _replicas_agree(job)
    done = job.of("done")
    assert sorted((e["rank"], _host(e)) for e in done) == [(0, "127.0.0.1"), (1, "127.0.0.1")], out


def test_a_spot_notice_on_one_host_takes_it_out_whole_at_a_commit_with_zero_rollback(jobs, tmp_path):
    """AWS's spot notice, read by the workers' notice watchers from a fake instance metadata service on each
    loopback host (as in ``test_notices.py``): 127.0.0.2 is to be reclaimed. Both its workers leave at the same
    commit; 127.0.0.1's two workers go on alone without rolling back a step and no round is aborted."""
    names = ["127.0.0.1", "127.0.0.2"]
    stop = tmp_path / "stop"
    with per_host(FakeAWSMetadata, names) as fakes:
        port = fakes[names[0]].port
        job = jobs(["run", "-np", "4", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts",
                    "-H", "127.0.0.1:2,127.0.0.2:2", "--notice-watcher", "aws",
                    sys.executable, str(PROBE), "--steps", "6", "--stop-when", str(stop)],
                   env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}",
                        "AWS_EC2_METADATA_DISABLED": "false"})
        job.wait_event("commit", rank=0, step=3)
        fakes["127.0.0.2"].set_spot_action("terminate", time.time() + 120)
        job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")), timeout=60,
                     what="127.0.0.1 training on alone")
        stop.touch()
        assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert re.search(r"host 127\.0\.0\.2 drained \(EC2 Spot interruption.*notice from aws-imds\).*its workers left at "
                     r"a commit; 0 steps lost", out), out
    resets = job.of("reset")
    assert sorted(_host(e) for e in resets) == ["127.0.0.1", "127.0.0.1"], resets
    assert all(e["executed"] == e["step"] for e in resets), resets  # zero rollback
    assert not [line for line in job.lines if "aborted" in line], out
    last = {e["worker"]: e["step"] for e in job.of("commit") if _host(e) == "127.0.0.2"}
    assert len(last) == 2 and len(set(last.values())) == 1, last  # the whole host left at one commit
    _replicas_agree(job)
    assert sorted(_host(e) for e in job.of("done")) == ["127.0.0.1", "127.0.0.1"], out


def test_a_worker_that_shards_another_layout_fails_with_one_line_and_its_host_leaves_before_any_step(jobs):
    """127.0.0.2[1]'s model has another hidden width. Left alone, FSDP2's all-gather over that host would
    hang or fail on mismatched shards; the state sync's layout check fails that worker first, with a line
    naming it, before any step. Its host leaves whole and stays blacklisted; 127.0.0.1 trains alone."""
    job = jobs(["run", "-np", "4", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts",
                "--blacklist-cooldown-range", "300", "300",
                "-H", "127.0.0.1:2,127.0.0.2:2", sys.executable, str(PROBE), "--steps", "3",
                "--odd-layout", "127.0.0.2[1]"])
    assert job.finish(timeout=90) == 0, job.output()
    out = job.output()
    errors = [line for line in job.lines if "hvd.shard: this worker" in line]
    assert len(errors) == 1 and errors[0].startswith("[3]<127.0.0.2[1]> cloud-elastic: hvd.shard:"), out  # one line
    assert ("hvd.shard: this worker (rank 3) shards another model or layout than 3 of the round's 4 workers "
            "(rank 0's): ") in errors[0], errors
    assert "host 127.0.0.2 blacklisted" in out, out
    assert not [e for e in job.of("commit") if _host(e) == "127.0.0.2"], out  # it never trained
    assert sorted((e["step"], _host(e)) for e in job.of("done")) == [(3, "127.0.0.1"), (3, "127.0.0.1")], out


def test_in_the_common_loop_a_sharded_job_commits_in_place_and_rolls_back_exactly(jobs):
    """No collective between the update and the commit: the shards are the commit (nothing copied). One worker
    of 127.0.0.2 dies as step 6 starts; its host-mate leaves, and 127.0.0.1's workers, whose gradient allreduce
    failed before their update, hold exactly their step-5 commit and finish alone."""
    job = jobs(["run", "-np", "4", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts",
                "-H", "127.0.0.1:2,127.0.0.2:2", sys.executable, str(PROBE), "--steps", "12", "--no-loss-log",
                "--die-before-forward", "127.0.0.2[1]:6"])
    assert job.finish(timeout=120) == 0, job.output()
    commits = job.of("commit")
    assert all(e["in_place"] for e in commits if e["step"] > 1), commits  # from the first window on
    resets = job.of("reset")
    assert sorted(_host(e) for e in resets) == ["127.0.0.1", "127.0.0.1"], resets
    _rolled_back_exactly(job, resets, size=4)
    _replicas_agree(job)
    assert sorted((e["step"], _host(e)) for e in job.of("done")) == [(12, "127.0.0.1"), (12, "127.0.0.1")]


def test_a_death_before_sharding_sends_its_host_mate_away_at_once_and_a_host_waiting_for_a_late_mate_reforms(jobs,
                                                                                                          tmp_path):
    """127.0.0.2[0] dies after ``hvd.init()``, before its ``hvd.shard()``. Its host-mate waits for it in the formation
    of the host's group, where no commit or rendezvous comes to say that its host is leaving; the driver's heartbeat
    reply does, and it leaves (exit 0) instead of waiting out the collective timeout (300 s).

    Meanwhile 127.0.0.1[1] is late to ``hvd.shard()`` (4 s), so 127.0.0.1[0] is waiting for it there when the death
    aborts round 1. A host-mate that has not arrived in an aborted round arrives in a later one: 127.0.0.1[0] gives
    up this round's formation, withdraws its address, joins round 2, and forms the group there, as 127.0.0.1[1] does
    when it comes. This is the path that ends what was a deadlock until the collective timeout: a host-mate whose
    own first round failed inside its ``hvd.init()`` (a peer died while it connected) is at rendezvous for the next
    round, which needs the worker waiting for it in ``hvd.shard()`` (seen once in a fresh-clone run; not
    reproducible on purpose: the death must fall inside one worker's connection but not its host-mate's).
    127.0.0.1 trains on alone until the test has seen 127.0.0.2[1] leave: without the heartbeat's word or the
    re-formation this test times out. 127.0.0.2 stays blacklisted to the end."""
    gate = tmp_path / "seen-leaving"
    job = jobs(["run", "-np", "4", "--min-np", "2", "--slots-per-host", "2", "--whole-hosts",
                "--blacklist-cooldown-range", "600", "600",
                "-H", "127.0.0.1:2,127.0.0.2:2", sys.executable, str(PROBE), "--steps", "3", "--step-sleep", "0.02",
                "--stop-when", str(gate), "--die-before-shard", "127.0.0.2[0]", "--late-to-shard", "127.0.0.1[1]:4"],
               env={"CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S": "300"})
    job.wait_for(lambda j: "leaving the job while forming its host's group" in j.output(), timeout=90,
                 what="127.0.0.2[1] to leave")
    job.wait_event("commit", rank=0, step=3, timeout=90)
    gate.touch()
    assert job.finish(timeout=90) == 0, job.output()
    out = job.output()
    line = next(x for x in out.splitlines() if "leaving the job while forming its host's group" in x)
    assert "<127.0.0.2[1]>" in line and "worker 127.0.0.2[0]" in line, line  # its reason names the dead mate
    assert re.search(r"<127\.0\.0\.1\[0\]> .*round 1 was aborted while it waited for a host-mate to form its host's "
                     r"group; joining the next round", out), out
    assert [e["worker"].split("#")[0] for e in job.of("dying")] == ["127.0.0.2[0]"]
    done = job.of("done")
    assert sorted(_host(e) for e in done) == ["127.0.0.1", "127.0.0.1"] and {e["size"] for e in done} == {2}, done
    assert not [e for e in job.of("commit") if _host(e) == "127.0.0.2"]
    _replicas_agree(job)
