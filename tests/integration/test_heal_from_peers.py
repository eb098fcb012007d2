"""Healing from peers, end to end: a worker admitted into a running job of three receives the committed
model and optimizer state from the three holders at once, each sending a part, point to point.

What a user sees: the newcomer enters its first round with the holders' parameters (the same checksum
at the same step), every worker finishes with the same parameters (their optimizer states were equal
too, or the newcomer's momentum would have moved its parameters apart), and the holders' log lines say
that more than one of them sent a part of the commit to the newcomer's rank.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.integration.harness import REPO, HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

HEAL_PROBE = REPO / "tests" / "integration" / "heal_probe.py"
_SENT = re.compile(r"worker (\S+): sent ([\d.]+ [kM]B) of commit (\d+) \(pieces (\d+) of (\d+)\) to rank\(s\) \[([\d, ]*)\]")
_RECEIVED = re.compile(r"worker (\S+): received ([\d.]+ [kM]B) of commit (\d+) from (\d+) holder\(s\)")


def test_a_newcomer_receives_the_commit_in_parts_from_several_holders(jobs, tmp_path):
    stop = tmp_path / "stop"
    four = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    hosts = HostsFile(tmp_path, four[:3])
    job = jobs(["run", "-np", "3", "--min-np", "3", "--max-np", "4", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", sys.executable, str(HEAL_PROBE), "--steps", "4", "--entry-events",
                "--stop-when", str(stop)])
    job.wait_event("commit", rank=0, step=3, timeout=60)
    hosts.set(four)
    after = job.wait_for(lambda j: len(j.of("entered", size=4)) >= 4 and j.of("entered", size=4), 60,
                         "4 workers entering a round of 4")
    [newcomer] = [e for e in after if e["worker"].startswith("127.0.0.4")]
    assert len({(e["step"], e["checksum"]) for e in after}) == 1, after  # the holders' parameters, bit for bit
    stop.touch()
    assert job.finish(timeout=60) == 0, job.output()
    done = job.of("done")
    assert len(done) == 4 and len({e["checksum"] for e in done}) == 1, done
    sent = [m for m in map(_SENT.search, job.lines) if m and str(newcomer["rank"]) in m.group(6).split(", ")]
    senders = {m.group(1) for m in sent}
    assert len(senders) >= 2 and not any(s.startswith("127.0.0.4") for s in senders), job.output()
    assert all(int(m.group(4)) < int(m.group(5)) for m in sent), [m.group(0) for m in sent]  # each sent a part
    received = [m for m in map(_RECEIVED.search, job.lines) if m and m.group(1).startswith("127.0.0.4")]
    assert received and int(received[-1].group(4)) == len(senders), job.output()
