"""``cloud-elastic run --metrics-port``: Prometheus metrics scraped over HTTP from a running job.

Two loopback hosts found by a discovery script; the worker on 127.0.0.2 is
killed (failure, rollback), 127.0.0.1 gets a rebalance recommendation from its
fake metadata service (a soft notice), and the discovery script fails for a
while (retryable errors). Each counter is compared with the events file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.harness import CLI, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def scrape(url: str) -> dict[str, float]:
    """Every sample of the page, by name with its labels (``name{label="v"}``)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_metrics_are_served_over_http_and_follow_the_job(jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    fail_flag = tmp_path / "discovery-fails"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nif [ -e '{fail_flag}' ]; then echo throttled >&2; exit 1; fi\n"
                      "echo 127.0.0.1\necho 127.0.0.2\n")
    script.chmod(0o755)
    with per_host(FakeAWSMetadata, ["127.0.0.1", "127.0.0.2"]) as fakes:
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{fakes['127.0.0.1'].port}",
               "AWS_EC2_METADATA_DISABLED": "false"}
        job = jobs(["run", "-np", "2", "--min-np", "1", "--host-discovery-script", str(script),
                    "--discovery-interval", "0.2", "--notice-watcher", "aws",
                    "--blacklist-cooldown-range", "600", "600", "--metrics-port", "0",
                    "--events-file", str(events), *probe_cmd("--steps", "100000")], env=env)
        where = job.wait_for(lambda j: next((m for line in j.lines
                                             if (m := re.search(r"Prometheus metrics at http://[\d.]+:(\d+)/metrics",
                                                                line))), None), what="the metrics address")
        url = f"http://127.0.0.1:{where.group(1)}/metrics"
        victim = job.wait_event("hello", rank=1)
        job.wait_event("commit", rank=0, step=5)
        before = scrape(url)
        assert before["cloud_elastic_world_size"] == 2 and before["cloud_elastic_round"] == 1
        assert before["cloud_elastic_resets_total"] == 0 and before["cloud_elastic_rollbacks_total"] == 0
        assert before[f'cloud_elastic_job_info{{job="{job.job_id()}"}}'] == 1

        os.kill(victim["pid"], signal.SIGKILL)
        job.wait_event("commit", rank=0, size=1)
        fakes["127.0.0.1"].set_rebalance()
        fail_flag.touch()
        job.wait_for(lambda j: any("notice from aws-imds for host 127.0.0.1" in line for line in j.lines),
                     what="the rebalance notice")
        job.wait_for(lambda j: scrape(url).get('cloud_elastic_discovery_errors_total{kind="retryable"}', 0) >= 2,
                     what="discovery errors counted")
        fail_flag.unlink()
        first = job.wait_event("commit", rank=0, size=1)
        # Rank 0's heartbeats carry its last commit (the probe commits every step from 0): the gauge follows it.
        job.wait_for(lambda j: scrape(url)["cloud_elastic_last_commit"] >= first["step"] + 20,
                     what="the last commit to advance")
        after = scrape(url)
        job.wait_event("commit", rank=0, step=int(after["cloud_elastic_last_commit"]))  # a step rank 0 committed
        job.proc.send_signal(signal.SIGINT)
        assert job.finish() == 130, job.output()

    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    rollback = [e for e in recorded if e["event"] == "rollback"]
    assert len(rollback) == 1
    assert after["cloud_elastic_world_size"] == 1 and after["cloud_elastic_round"] == 2
    assert after["cloud_elastic_resets_total"] == 1 and after["cloud_elastic_rollbacks_total"] == 1
    assert after["cloud_elastic_steps_lost_total"] == rollback[0]["steps_lost"]
    assert after["cloud_elastic_worker_failures_total"] == 1 and after["cloud_elastic_workers_left_total"] == 0
    assert after['cloud_elastic_notices_total{source="aws-imds"}'] == 1
    assert after['cloud_elastic_discovery_errors_total{kind="retryable"}'] >= 2
    assert 'cloud_elastic_discovery_errors_total{kind="fatal"}' not in after
    assert after["cloud_elastic_discovery_latency_seconds_count"] > after[
        'cloud_elastic_discovery_errors_total{kind="retryable"}']
    assert after["cloud_elastic_discovery_latency_seconds_sum"] > 0
    assert after["cloud_elastic_steps_per_second"] > 0


def test_with_every_worker_killed_the_metrics_read_0_as_status_does(jobs, tmp_path):
    """A reviewer's run: ``-np 2 --min-np 2`` on 127.0.0.1:1 and 127.0.0.2:1, both workers killed with SIGKILL while
    training. 4 s later status said world size 0 and steps/s 10.30, while /metrics said ``world_size 2.0`` and
    ``steps_per_second 10.3``, and would have for the whole --elastic-timeout: no alert on either fired."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    job = jobs(["run", "-np", "2", "--min-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--metrics-port", "0",
                "--checkpoint-dir", str(tmp_path / "ckpt"), "--blacklist-cooldown-range", "600", "600",
                "--elastic-timeout", "120", *probe_cmd("--steps", "100000")], env=env)
    where = job.wait_for(lambda j: next((m for line in j.lines
                                         if (m := re.search(r"Prometheus metrics at http://[\d.]+:(\d+)/metrics",
                                                            line))), None), what="the metrics address")
    url = f"http://127.0.0.1:{where.group(1)}/metrics"
    pids = [job.wait_event("hello", rank=rank)["pid"] for rank in (0, 1)]
    job.wait_event("commit", rank=0, step=10)
    job.wait_for(lambda j: scrape(url)["cloud_elastic_steps_per_second"] > 0, what="a step rate")
    assert scrape(url)["cloud_elastic_world_size"] == 2
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # Rank 0's heartbeats stop with it: four heartbeat intervals (0.5 s) later its rate reads 0.
    figures = job.wait_for(lambda j: (m := scrape(url))["cloud_elastic_world_size"] == 0
                           and m["cloud_elastic_steps_per_second"] == 0 and m, timeout=15,
                           what="world size 0 and step rate 0")
    shown = subprocess.run([*CLI, "status", "--json", job.job_id()], env={**os.environ, **env},
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    reply = json.loads(shown.stdout)
    assert (reply["world_size"], reply["steps_per_s"]) == (0, 0.0), reply
    assert figures["cloud_elastic_round"] == 1  # no round formed since: the job waits for two slots
    job.proc.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.output()
