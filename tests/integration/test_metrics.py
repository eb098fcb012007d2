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
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.emulator.fake_metadata import FakeAWSMetadata, per_host
from tests.integration.harness import probe_cmd

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
