"""A loop that clips its parameters in place between commits survives a peer's death, exactly.

WGAN's critic clamps its weights under ``torch.no_grad()`` at the start of each
iteration: outside the optimizer, after the last commit and before the next update.
Here the clipping starts after the loop was confirmed in place (the hardest case:
nothing kept aside any more), and a peer dies in a later step's backward. The job
must go on (not end with "training state lost"), the survivors resuming from
exactly the state they committed, identical on both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROBE = str(Path(__file__).with_name("clip_probe.py"))


@pytest.mark.timeout(90)
def test_survivors_of_a_clipping_loop_resume_exactly_from_the_last_commit(jobs):
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                "--blacklist-cooldown-range", "600", "600", "--start-timeout", "60",
                sys.executable, PROBE, "--steps", "9", "--clip-from", "3", "--kill-host", "127.0.0.3",
                "--kill-at", "6"])
    assert job.finish(timeout=80) == 0, job.output()[-4000:]
    assert "training state lost" not in job.output()
    commits = {}
    for e in job.events:
        if e.kind == "commit" and e["size"] == 3:
            commits.setdefault(e["step"], set()).add((e["checksum"], e["in_place"]))
    assert all(len(v) == 1 for v in commits.values()), commits  # the replicas were identical
    # In place until the clipping was seen (step 4's update), kept from then on.
    assert [next(iter(commits[s]))[1] for s in range(1, 7)] == [True, True, True, False, False, False]
    resumed = [e for e in job.events if e.kind == "resumed" and e["size"] == 2]
    assert sorted(e["host"] for e in resumed) == ["127.0.0.1", "127.0.0.2"]
    for e in resumed:
        assert (e["step"], e["checksum"]) == (6, next(iter(commits[6]))[0]), e
    done = [e for e in job.events if e.kind == "done"]
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1 and all(e["step"] == 9 for e in done)
