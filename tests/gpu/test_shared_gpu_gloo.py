"""Three workers on one GPU over Gloo with CUDA tensors: scaled up, killed, replaced; every restore bitwise.

Two NCCL ranks cannot share a GPU (``ncclInvalidUsage ... Duplicate GPU detected``),
so with one GPU the multi-worker paths run over Gloo, which carries CUDA tensors:
``-x CLOUD_ELASTIC_BACKEND=gloo``. Each worker is the only slot of its loopback
host, so each one's ``cuda:<local rank>`` is ``cuda:0``. The loop does a loss
allreduce between ``step()`` and ``commit()`` at every step, so from its first
such window on every commit keeps a copy of the parameters and optimizer state
(see worker/ledger.py): a peer that dies after its update leaves the survivors
past their own update, and only that copy can bring them back.
"""

from __future__ import annotations

import pytest

from tests.gpu.support import by_pid, commit_checksums, env, probe
from tests.integration.harness import HostsFile

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]


def test_three_workers_sharing_one_gpu_are_scaled_up_killed_and_replaced_with_bitwise_restores(jobs, tmp_path,
                                                                                               gpu_report):
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    once = tmp_path / "once"
    once.mkdir()
    # resets: 1 the scale-up to three, 2 the death of 127.0.0.2's worker, 3 its replacement joining.
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "1", "1", "--elastic-timeout", "60",
                "-x", "CLOUD_ELASTIC_BACKEND=gloo",
                *probe("--steps", "30", "--min-resets", "3", "--tail-steps", "5", "--log-every", "1",
                       "--step-sleep", "0.05", "--die", "127.0.0.2/0,update,10,3", "--once-dir", str(once))],
               env=env())
    job.wait_event("commit", step=5, timeout=90)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    assert job.finish(150) == 0, job.output()
    out = job.output()

    hellos = job.of("hello")
    assert {(e["backend"], e["device"]) for e in hellos} == {("gloo", "cuda:0")}, hellos
    assert sorted(e["slot"] for e in hellos) == ["127.0.0.1/0", "127.0.0.2/0", "127.0.0.2/0", "127.0.0.3/0"], hellos
    # The loop's logging allreduce sits in the commit window from the first step: the first commit was kept
    # whole in host memory until the loop was known (worker/ledger.py), so no in-place update ever had to be
    # undone without a copy and nothing is warned about; every later commit is kept (checked just below).
    assert "from now on every update keeps the values it overwrites" not in out
    assert not [e for e in job.of("commit") if e["step"] > 2 and e["kept"] is False], "a commit after the first " \
        "window kept no copy"

    # Every worker committed the same bytes at every step, and every round started from one of those commits.
    committed = commit_checksums(job)
    assert all(len(sums) == 1 for sums in committed.values()), {s: c for s, c in committed.items() if len(c) > 1}
    for e in job.of("resumed"):
        if e["step"] > 0:
            assert e["checksum"] in committed[e["step"]], e

    # The death: 127.0.0.2's first worker killed itself right after its update, in a round of three.
    [dying] = job.of("dying")
    assert (dying["slot"], dying["size"]) == ("127.0.0.2/0", 3), dying
    victim, k = dying["pid"], dying["step"]
    procs = by_pid(job.events)
    undone = 0
    for pid, events in procs.items():
        if pid == victim or not any(e.kind == "resumed" and e["round"] == dying["round"] for e in events):
            continue  # not a member of the round the death ended
        # A survivor of that round resumed the next one at the step the death interrupted, from its commit ...
        after = [e for e in events if e.kind == "resumed" and e["round"] > dying["round"]]
        assert after and after[0]["step"] == k, (pid, after)
        assert after[0]["checksum"] in committed[k]
        # ... although its own update of that step had already changed the tensors (it reached the logging allreduce).
        window = [e for e in events if e.kind == "window" and e["step"] == k]
        if window:
            assert window[0]["checksum"] not in committed[k]
            undone += 1
    assert undone >= 1, "no survivor had its update undone by the restore (none reached the logging allreduce)"

    # The scale-up and the replacement: each newcomer started from rank 0's commit in a round of three.
    newcomers = [events for pid, events in procs.items()
                 if pid != victim and events[0]["slot"] in ("127.0.0.2/0", "127.0.0.3/0")]
    assert len(newcomers) == 2
    for events in newcomers:
        first = next(e for e in events if e.kind == "resumed")
        assert first["size"] == 3 and first["step"] > 0 and first["checksum"] in committed[first["step"]], first

    done = job.of("done")
    assert len(done) == 3 and {e["size"] for e in done} == {3} and len({e["checksum"] for e in done}) == 1, done
    gpu_report(f"3 workers on one GPU over Gloo: death at step {k}, {undone} survivor update(s) undone by the "
               f"restore, {max(e['resets'] for e in done)} resets, final step {done[0]['step']}")
