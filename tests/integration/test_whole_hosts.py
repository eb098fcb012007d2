"""``--whole-hosts`` with real workers: a host's workers sit side by side in a round and leave together.

Loopback hosts with two slots each.

- One worker of the second host is SIGKILLed: its sibling leaves too (a model sharded across the
  host would be missing a shard), the host is blacklisted, and the first host's two workers roll
  back to their last commit and finish on their own.
- A host drained by hand (as a spot notice would) leaves whole at a commit: its two workers go,
  the other host's two train on with zero rollback, and a replacement host found by discovery
  joins whole, its workers side by side as ranks 2 and 3, synced to identical replicas.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.integration.harness import REPO, HostsFile, probe_cmd
from tests.integration.test_status import runtime_dir, status  # noqa: F401 (runtime_dir is a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_a_killed_worker_takes_its_host_out_and_the_other_host_finishes(jobs, runtime_dir):
    job = jobs(["run", "-np", "4", "--min-np", "2", "-H", "127.0.0.1:2,127.0.0.2:2", "--slots-per-host", "2",
                "--whole-hosts", "--blacklist-cooldown-range", "300", "300",
                *probe_cmd("--steps", "200", "--commit-every", "5")], env={"XDG_RUNTIME_DIR": str(runtime_dir)})
    hello = {e["worker"]: e for e in (job.wait_event("hello", rank=r) for r in range(4))}
    # Ranks follow hosts side by side, local rank = slot: 0, 1 on 127.0.0.1; 2, 3 on 127.0.0.2.
    assert sorted((e["rank"], w.split("[")[0], e["local_rank"]) for w, e in hello.items()) == [
        (0, "127.0.0.1", 0), (1, "127.0.0.1", 1), (2, "127.0.0.2", 0), (3, "127.0.0.2", 1)]
    victim = job.wait_event("commit", rank=2, step=10)
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_event("commit", rank=0, size=2)  # 200 steps of 0.05 s: several seconds left to ask for its status
    shown = status(runtime_dir, job.job_id())
    assert shown.returncode == 0 and "(-np 4, --min-np 2, --max-np 4, whole hosts of 2 slot(s))" in shown.stdout, \
        shown.stdout + shown.stderr
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "a host leaves whole (--whole-hosts)" in out, out
    assert "host 127.0.0.2 blacklisted" in out, out
    done = job.of("done")
    assert sorted(e["worker"].split("[")[0] for e in done) == ["127.0.0.1", "127.0.0.1"], out
    assert {e["size"] for e in done} == {2} and {e["step"] for e in done} == {200}
    assert len({e["checksum"] for e in done}) == 1
    # The survivors went back to a commit: a step they resumed from is a multiple of --commit-every.
    resets = [e for e in job.of("reset") if e["size"] == 2]
    assert resets and all(e["step"] % 5 == 0 for e in resets), resets
    # The sibling was sent away, not failed: one worker failed in all.
    assert out.count("killed by signal 9") == 1, out


def test_a_drained_host_leaves_whole_without_a_rollback_and_a_new_host_joins_whole(jobs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    env = {"XDG_RUNTIME_DIR": str(run)}
    stop = tmp_path / "stop"
    hosts = HostsFile(tmp_path, ["127.0.0.1:2", "127.0.0.2:2"])
    job = jobs(["run", "-np", "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.5", "--slots-per-host", "2", "--whole-hosts",
                *probe_cmd("--steps", "20", "--stop-when", str(stop))], env=env)
    job.wait_event("commit", size=4, step=5)
    drained = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "drain", job.job_id(), "127.0.0.2"],
                             cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and "host 127.0.0.2 drains" in drained.stdout, drained.stdout + drained.stderr
    hosts.set(["127.0.0.1:2", "127.0.0.3:2"])  # the spot group replaces the instance it takes away
    job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")), timeout=60, what="the first host alone")
    joined = job.wait_for(lambda j: [e for e in j.of("hello") if e["worker"].startswith("127.0.0.3")] if len(
        [e for e in j.of("hello") if e["worker"].startswith("127.0.0.3")]) == 2 else None, timeout=90,
        what="both workers of the new host")
    job.wait_for(lambda j: any(e["size"] == 4 and e["worker"].startswith("127.0.0.3") for e in j.of("commit")),
                 timeout=90, what="the new host training")
    stop.touch()
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    # Both of the drained host's workers left at a commit, and nobody rolled back.
    assert "aborted" not in out, out
    assert not [e for e in job.of("reset") if e["executed"] != e["step"]], out
    done = job.of("done")
    assert sorted((e["rank"], e["worker"].split("[")[0]) for e in done) == [
        (0, "127.0.0.1"), (1, "127.0.0.1"), (2, "127.0.0.3"), (3, "127.0.0.3")], out
    assert len({e["checksum"] for e in done}) == 1 and {e["size"] for e in done} == {4}, done
    # The new host's workers sit side by side, local rank = slot, from their first round.
    assert sorted((e["worker"].split("]")[0] + "]", e["rank"], e["local_rank"]) for e in joined) == [
        ("127.0.0.3[0]", 2, 0), ("127.0.0.3[1]", 3, 1)], joined
