"""A round's first sync takes its facts from rendezvous (``worker.commit.sync_facts``): what each member said there
of the commit it holds, told to rank 0 in its assignment. A member whose account went stale before the sync (it lost
its commit after it asked) must not be counted a holder, which would keep its own state: its sync fails, a new
round forms, and it receives rank 0's commit. What a user sees: every worker ends with the same parameters, and the
stale worker says why its sync failed, once.
"""

from __future__ import annotations

import sys

import pytest

from tests.integration.harness import REPO, HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROBE = REPO / "tests" / "integration" / "stale_probe.py"


def test_a_member_whose_account_went_stale_after_rendezvous_receives_rank_0s_commit(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", sys.executable, str(PROBE), "--steps", "40", "--stale", "127.0.0.2"])
    job.wait_event("commit", step=3, timeout=60)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    assert job.finish(timeout=100) == 0, job.output()
    assert job.of("stale"), job.output()  # the account went stale at the admission
    done = job.of("done")
    assert len(done) == 3 and {e["size"] for e in done} == {3}, done
    assert len({e["checksum"] for e in done}) == 1, done  # its own changed parameters were not kept
    said = [line for line in job.lines if "a stale account" in line]
    assert len(said) == 1 and "<127.0.0.2[0]>" in said[0], job.output()
