"""``--whole-hosts`` with real workers: a host's workers sit side by side in a round and leave together.

One job on loopback hosts with two slots each, 127.0.0.1 and 127.0.0.2 at first (a merge of two
scenarios that share a job: the graceful leave and the join, then the failure):

- 127.0.0.2 is drained by hand (as a spot notice would drain it) while discovery swaps it for
  127.0.0.3: both its workers leave at a commit, the first host's two train on with zero rollback,
  and the new host joins whole, its workers side by side as ranks 2 and 3 (local rank = slot).
- Then one worker of 127.0.0.3 is SIGKILLed: its sibling leaves too (a model sharded across the
  host would be missing a shard), the host is blacklisted, and the first host's two workers roll
  back to their last commit and finish on their own, with identical replicas.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.integration.harness import REPO, HostsFile, probe_cmd
from tests.integration.test_status import runtime_dir, status  # noqa: F401 (runtime_dir is a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_host_leaves_and_joins_whole_and_a_killed_worker_takes_its_host_out(jobs, runtime_dir, tmp_path):
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    stop = tmp_path / "stop"
    hosts = HostsFile(tmp_path, ["127.0.0.1:2", "127.0.0.2:2"])
    job = jobs(["run", "-np", "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.5", "--slots-per-host", "2", "--whole-hosts",
                "--blacklist-cooldown-range", "300", "300", *probe_cmd("--steps", "20", "--stop-when", str(stop))],
               env=env)
    hello = {e["worker"]: e for e in (job.wait_event("hello", rank=r) for r in range(4))}
    # Ranks follow hosts side by side, local rank = slot: 0, 1 on 127.0.0.1; 2, 3 on 127.0.0.2.
    assert sorted((e["rank"], w.split("[")[0], e["local_rank"]) for w, e in hello.items()) == [
        (0, "127.0.0.1", 0), (1, "127.0.0.1", 1), (2, "127.0.0.2", 0), (3, "127.0.0.2", 1)]
    job.wait_event("commit", size=4, step=5)

    # A graceful leave, and a new host in its place.
    drained = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "drain", job.job_id(), "127.0.0.2"],
                             cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and "host 127.0.0.2 drains" in drained.stdout, drained.stdout + drained.stderr
    hosts.set(["127.0.0.1:2", "127.0.0.3:2"])  # the spot group replaces the instance it takes away
    job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")), timeout=60, what="the first host alone")

    def newcomers(j):
        found = [e for e in j.of("hello") if e["worker"].startswith("127.0.0.3")]
        return found if len(found) == 2 else None

    joined = job.wait_for(newcomers, timeout=90, what="both workers of the new host")
    assert sorted((e["worker"].split("]")[0] + "]", e["rank"], e["local_rank"]) for e in joined) == [
        ("127.0.0.3[0]", 2, 0), ("127.0.0.3[1]", 3, 1)], joined
    victim = job.wait_for(lambda j: next((e for e in j.of("commit") if e["size"] == 4 and e["rank"] == 2
                                          and e["worker"].startswith("127.0.0.3")), None),
                          timeout=90, what="the new host training")
    out = job.output()
    assert "aborted" not in out, out  # the drained host's workers left at a commit: nobody rolled back
    assert not [e for e in job.of("reset") if e["executed"] != e["step"]], out

    # A failure: the killed worker's host-mate leaves with it.
    before = len(job.of("commit"))
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_for(lambda j: any(e["size"] == 2 for e in j.of("commit")[before:]), timeout=60,
                 what="the first host alone again")
    shown = status(runtime_dir, job.job_id())
    assert shown.returncode == 0 and "(-np 4, --min-np 2, --max-np 4, whole hosts of 2 slot(s))" in shown.stdout, \
        shown.stdout + shown.stderr
    stop.touch()
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "a host leaves whole (--whole-hosts)" in out, out
    assert "host 127.0.0.3 blacklisted" in out, out
    done = job.of("done")
    assert sorted((e["rank"], e["worker"].split("[")[0]) for e in done) == [(0, "127.0.0.1"), (1, "127.0.0.1")], out
    assert len({e["checksum"] for e in done}) == 1 and {e["size"] for e in done} == {2}, done
