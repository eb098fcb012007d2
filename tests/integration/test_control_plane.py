"""A forged, malformed or oversized control message is rejected and the job is unharmed."""

from __future__ import annotations

import http.client
import json
import re
import time

import pytest

from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, body, headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_forged_messages_are_rejected_and_the_job_completes(jobs):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:2", *probe_cmd("--steps", "30", "--step-sleep", "0.05")])
    first = job.wait_event("commit", rank=0, step=3)
    port = int(job.wait_for(lambda j: re.search(r"control port (\d+)", "\n".join(j.lines)), what="port").group(1))
    forged = json.dumps(
        {"v": 1, "job": job.job_id(), "kind": "completed", "ts": time.time(), "nonce": "x" * 24, "worker": first["worker"]}
    ).encode()
    # A message claiming training is done, signed with the wrong key.
    assert _post(port, "/v1/completed", forged, {"X-Cloud-Elastic-Signature": "0" * 64}) == 401
    assert _post(port, "/v1/completed", forged, {}) == 401
    assert _post(port, "/v1/completed", b"\x80garbage", {"X-Cloud-Elastic-Signature": "ab"}) == 401
    assert _post(port, "/v1/completed", b"x" * (70 * 1024), {"X-Cloud-Elastic-Signature": "ab"}) == 413
    # A pickle payload is never unpickled: it is just a bad signature.
    assert _post(port, "/v1/poll", b"\x80\x04\x95cos\nsystem\n", {"X-Cloud-Elastic-Signature": "00"}) == 401
    assert job.finish() == 0, job.output()
    assert "rejected a request from 127.0.0.1: bad or missing signature" in job.output()
    done = job.of("done")
    # Training really ran to the end: the forged "completed" changed nothing.
    assert len(done) == 2 and {e["step"] for e in done} == {30}
