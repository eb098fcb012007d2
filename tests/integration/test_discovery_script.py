"""Discovery scripts under a real job: first failure fatal, later failures survived."""

from __future__ import annotations

import pytest

from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _script(tmp_path, body: str):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("echo 127.0.0.1:2\necho 'this is not a host'\n", "line 2 is not host[:slots]"),
        ("echo 127.0.0.1:0\n", "slots must be >= 1"),
        ("echo 127.0.0.1:-3\n", "slots must be >= 1"),
        ("echo 127.0.0.1:1\necho 127.0.0.1:2\n", "listed twice (line 1 and 2)"),
        ("echo boom >&2\nexit 3\n", "exited with code 3: boom"),
    ],
)
def test_a_failing_first_discovery_is_retried_then_fails_with_a_clear_message(jobs, tmp_path, body, message):
    job = jobs(["run", "-np", "1", "--start-timeout", "3", "--host-discovery-script", str(_script(tmp_path, body)),
                *probe_cmd()])
    assert job.finish(timeout=60) == 1, job.output()
    last = job.lines[-1]
    assert "host discovery kept failing for 3s (--start-timeout)" in last and message in last, last
    warnings = [line for line in job.lines if "host discovery failed" in line and "retrying" in line]
    assert len(warnings) == 1, job.output()  # said once, not once per attempt


def test_a_first_discovery_that_recovers_within_the_start_timeout_runs_the_job(jobs, tmp_path):
    script = _script(tmp_path, f"n=$(cat '{tmp_path}/n' 2>/dev/null || echo 0); echo $((n+1)) > '{tmp_path}/n'\n"
                               "if [ $n -lt 2 ]; then echo throttled >&2; exit 1; fi\necho 127.0.0.1:1\n")
    job = jobs(["run", "-np", "1", "--host-discovery-script", str(script), *probe_cmd("--steps", "3")])
    assert job.finish(timeout=90) == 0, job.output()


def test_a_hanging_first_discovery_is_killed_and_retried_until_the_start_timeout(jobs, tmp_path):
    script = _script(tmp_path, "sleep 600\n")
    job = jobs(["run", "-np", "1", "--start-timeout", "2", "--host-discovery-script", str(script),
                "--discovery-timeout", "1", *probe_cmd()])
    assert job.finish(timeout=60) == 1, job.output()
    assert "did not finish within 1s and was killed" in job.lines[-1]


def test_later_failures_and_hangs_keep_the_last_hosts_and_the_job_completes(jobs, tmp_path):
    hosts = HostsFile(tmp_path, ["127.0.0.1:2"])
    # After the first good answer the script turns bad: garbage, then a hang, then an error exit.
    hosts.script.write_text(
        f"#!/bin/sh\nn=$(cat '{tmp_path}/n' 2>/dev/null || echo 0); echo $((n+1)) > '{tmp_path}/n'\n"
        f"case $n in 0) cat '{hosts.file}';; 1) echo '@@garbage@@';; 2) sleep 600;; *) exit 1;; esac\n"
    )
    job = jobs([
        "run", "-np", "2", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
        # Long enough for the three failures while discovery backs off (0.2, 0.4, 0.8 s after each failure).
        "--discovery-timeout", "1", *probe_cmd("--steps", "90", "--step-sleep", "0.05"),
    ])
    assert job.finish() == 0, job.output()
    out = "\n".join(job.lines)
    assert "host discovery failed: discovery script discover.sh: line 1 is not host[:slots]" in out
    assert "did not finish within 1s and was killed" in out
    assert "exited with code 1" in out
    assert {e["step"] for e in job.of("done")} == {90} and len(job.of("done")) == 2


def test_a_first_discovery_failing_with_a_new_number_each_time_is_said_once_and_asked_less_often(jobs, tmp_path):
    """A cloud API's error carries a request id or a time: before, a new job logged it once a call (one line a
    second for --start-timeout, 600 s by default) and called at the interval; now as a running job does."""
    calls = tmp_path / "calls"
    script = _script(tmp_path, f"echo x >> '{calls}'\necho \"$(date +%s%N) ERROR could not reach the API\" >&2\nexit 1\n")
    job = jobs(["run", "-np", "1", "--start-timeout", "8", "--discovery-interval", "1", "--host-discovery-script",
                str(script), *probe_cmd()])
    assert job.finish(timeout=60) == 1, job.output()
    warnings = [line for line in job.lines if "host discovery failed" in line]
    assert len(warnings) == 1 and "waits for hosts up to --start-timeout 8s" in warnings[0], job.output()
    assert len(calls.read_text().split()) <= 5, calls.read_text()  # 1, 2, 4 s apart: not one a second
