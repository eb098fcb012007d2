"""``--whole-hosts`` with real workers: a host's workers sit side by side in a round and leave together.

Two loopback hosts with two slots each. One worker of the second host is SIGKILLed: its sibling
leaves too (a model sharded across the host would be missing a shard), the host is blacklisted,
and the first host's two workers roll back to their last commit and finish on their own.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.harness import probe_cmd
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
