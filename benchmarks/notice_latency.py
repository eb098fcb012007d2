"""Spot notice to new size: how long the survivors take to step at the new size, and what is lost.

For each notice source (the AWS, GCP and Azure metadata watchers against local fake
metadata services, and AWS queue mode against moto's SQS), a job on three loopback
hosts (commit every 2 steps, 20 ms steps) gets a notice for one host mid-training.
Measured per run, on the benchmark's own clock (lines timestamped as they arrive):

* notice -> new size: from the moment the notice is published to the first commit
  the survivors make at world size 2;
* steps lost: steps the survivors executed twice (0 when they left at a commit).

Run: ``.venv/bin/python benchmarks/notice_latency.py [--runs 5] [--quick]`` (20-60 s a
run); it prints a table and writes it into docs/benchmarks.md (``docsection``: section
``notice-latency`` and its glance row). ``--only SOURCE`` measures one source and only prints.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import docsection
from common import REPO, pct, stamp, to_new_size, where

sys.path.insert(0, str(REPO))

from tests.emulator.fake_metadata import (  # noqa: E402
    FakeAWSMetadata, FakeAzureMetadata, FakeGCPMetadata, per_host,
)
from tests.integration.harness import HostsFile, Job, probe_cmd  # noqa: E402

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
LEAVING = "127.0.0.3"
STEP_S = 0.02
COMMIT_EVERY = 2
GLANCE_TARGET = "Spot notice → stepping at the new size ≤ 1 s + one step, 0 steps lost"


def _metadata_source(cloud: str) -> Callable[[Path], Iterator[tuple[list[str], dict, Callable[[], None]]]]:
    factory = {"aws": FakeAWSMetadata, "gcp": FakeGCPMetadata, "azure": FakeAzureMetadata}[cloud]

    @contextlib.contextmanager
    def source(tmp: Path):
        with per_host(factory, HOSTS) as fakes:
            port = fakes[HOSTS[0]].port
            env = {
                "aws": {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}", "AWS_EC2_METADATA_DISABLED": "false"},
                "gcp": {"GCE_METADATA_HOST": f"{{host}}:{port}"},
                "azure": {"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": f"http://{{host}}:{port}"},
            }[cloud]
            hosts = HostsFile(tmp, HOSTS)
            args = ["--host-discovery-script", str(hosts.script), "--notice-watcher", cloud]
            fake = fakes[LEAVING]

            def publish() -> None:
                if cloud == "aws":
                    fake.set_spot_action("terminate", time.time() + 120)
                elif cloud == "gcp":
                    fake.set_preempted(True)
                else:
                    fake.add_event("Preempt", not_before=time.time() + 60)

            yield args, env, publish

    return source


@contextlib.contextmanager
def _sqs_source(tmp: Path):
    import logging

    from moto.server import ThreadedMotoServer

    from tests.emulator.moto_env import MotoProxy, event, make_group, sqs_client

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = MotoProxy(f"http://{host}:{port}").start()
    try:
        name = f"bench-{int(time.time() * 1000) % 10**9}"
        members = make_group(proxy.url, name, size=3, instance_type="g4dn.xlarge", cidr="10.84.1.0/24")
        sqs = sqs_client(proxy.url)
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        args = ["--aws-asg", name, "--aws-region", "us-east-1", "--aws-endpoint-url", proxy.url,
                "--aws-notice-queue", url, "--address-map", "10.84.1.0/24=127.0.84.0/24"]
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        leaving = members[2]["id"]

        def publish() -> None:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            sqs.send_message(QueueUrl=url, MessageBody=event(
                "EC2 Spot Instance Interruption Warning", {"instance-id": leaving, "instance-action": "terminate"},
                time=now))

        yield args, env, publish
    finally:
        proxy.stop()
        server.stop()


SOURCES = {
    "aws-imds": _metadata_source("aws"),
    "gcp-metadata": _metadata_source("gcp"),
    "azure-scheduled-events": _metadata_source("azure"),
    "aws-sqs (queue mode)": _sqs_source,
}


def one_run(source, tmp: Path, steps: int) -> tuple[float, int]:
    with source(tmp) as (args, env, publish):
        job = Job(["run", "-np", "3", "--min-np", "1", "--discovery-interval", "1", *args,
                        *probe_cmd("--steps", str(steps), "--step-sleep", str(STEP_S), "--commit-every", str(COMMIT_EVERY))],
                       env=env)
        try:
            job.wait_event("commit", rank=0, step=40, timeout=120)
            published = time.monotonic()
            publish()
            when, lost = to_new_size(job, 2)
        finally:
            if job.proc.poll() is None:
                job.kill()
        return when - published, lost


def main() -> None:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="runs per source (default 5; 1 with --quick)")
    p.add_argument("--only", choices=sorted(SOURCES), action="append",
                   help="measure only this source (repeatable; implies --no-write)")
    docsection.add_arguments(p)
    args = p.parse_args()
    runs = args.runs or (1 if args.quick else 5)
    args.no_write = args.no_write or bool(args.only)
    rows, worst, most_lost = [], (0.0, ""), 0
    for name, source in SOURCES.items():
        if args.only and name not in args.only:
            continue
        latencies, losses = [], []
        for i in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                latency, lost = one_run(source, Path(tmp), 160 if args.quick else 400)
            latencies.append(latency)
            losses.append(lost)
            print(f"{name} run {i + 1}: notice -> new size {latency:.2f} s, steps lost {lost}", flush=True)
        p95 = pct(latencies, 0.95)
        worst, most_lost = max(worst, (p95, name)), max(most_lost, *losses)
        rows.append(f"| {name} | {statistics.median(latencies):.2f} s | {p95:.2f} s | {max(losses)} | {runs} |")
    budget = 1.0 + STEP_S
    met = worst[0] <= budget and most_lost == 0
    text = "\n".join([
        f"{stamp(f'benchmarks/notice_latency.py --runs {runs}')} Three loopback hosts, {STEP_S * 1000:.0f} ms "
        f"steps, a commit every {COMMIT_EVERY} steps, `--discovery-interval 1`. Target: at most 1 s plus one step "
        f"({budget:.2f} s), 0 steps lost: {'met' if met else 'NOT met'}.",
        "",
        "| notice source | notice -> stepping at the new size, p50 | p95 | steps lost (max) | runs |",
        "|---|---|---|---|---|",
        *rows,
    ])
    row = [GLANCE_TARGET, f"p95 {worst[0]:.2f} s (slowest source: {worst[1]}), {most_lost} lost, {runs} run(s) a source",
           f"{worst[0] / budget:.2f}", where("Spot notice to new size"), docsection.verdict(met)]
    docsection.publish(args, "notice-latency", "Spot notice to new size", text, [row])


if __name__ == "__main__":
    main()
