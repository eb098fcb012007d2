"""A slow network: what a link probe costs, what it measures, and how soon a job drains the slow host.

    .venv/bin/python benchmarks/link_probe.py [--quick] [--jobs N]

In this process, three link probes on loopback hosts 127.0.0.1-3 (``worker.link.link_probe``):

* a probe of two healthy peers, repeated: its time per peer and its figures (MB/s);
* the same with the test hook (``CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S``) on one peer, at a few rates;
* noise: sweeps of the three pairs while two CPU hogs load this 2-core machine, each judged by the
  driver's rule (``driver.job.links.slow_host``): how many sweeps name a host (a suspect) and how many
  would be confirmed (the next sweep names the same host), where a healthy machine should name none;
* what the link report adds to a heartbeat (bytes on the wire, time to build and parse it).

Then ``--jobs N`` times a real job (``cloud-elastic run``, three workers, the hook on 127.0.0.3 at
20 kB/s): from the first round formed to the ``slow_link`` event, and to the next round (without it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docsection
from common import PY, REPO, command, pct, stamp

from cloud_elastic.driver.job.links import LINK_FACTOR, slow_host
from cloud_elastic.protocol import LinkReport, PollRequest, ProbeOrder
from cloud_elastic.worker.link.link_probe import LinkProbe, SlowLink

SECTION = "Slow networks"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _order(prober: LinkProbe, seq: int, peers: dict[str, LinkProbe]) -> tuple[dict[str, float], float]:
    started = time.monotonic()
    prober.order(ProbeOrder(seq, tuple(f"{h}@{h}:{p.port}" for h, p in peers.items())))
    while prober.report().probed < seq:
        time.sleep(0.0005)
    return dict(prober.report().mb_s), (time.monotonic() - started) / len(peers)


def probe_cost(repeats: int) -> dict:
    """Per-peer time and figures of healthy probes, and of probes of a hooked peer at a few rates."""
    out: dict = {}
    a, b = LinkProbe(HOSTS[0], "s"), LinkProbe(HOSTS[1], "s")
    for p in (a, b):
        p.start()
    seq = 0
    times, figures = [], []
    for _ in range(repeats):
        seq += 1
        got, per_peer = _order(a, seq, {HOSTS[1]: b})
        times.append(per_peer)
        figures.append(got[HOSTS[1]])
    out["healthy"] = {"time_s": statistics.median(times), "p95_s": pct(times, 0.95),
                      "mb_s": statistics.median(figures), "min_mb_s": min(figures)}
    for rate in (10e6, 1e6, 2e5, 2e4):
        slow = LinkProbe(HOSTS[2], "s", SlowLink(rate))
        slow.start()
        seq += 1
        got, per_peer = _order(a, seq, {HOSTS[2]: slow})
        out[f"{rate:g}"] = {"time_s": per_peer, "mb_s": got[HOSTS[2]]}
        slow.close()
    for p in (a, b):
        p.close()
    return out


def noise(sweeps: int) -> dict:
    """Sweeps of three healthy hosts' pairs beside two CPU hogs: figures, suspects, confirmations."""
    probes = {h: LinkProbe(h, "s") for h in HOSTS}
    for p in probes.values():
        p.start()
    hogs = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(2)]
    suspects, confirmed, last, lows, seq = 0, 0, None, [], 0
    try:
        for _ in range(sweeps):
            pairs = {}
            for i, h in enumerate(HOSTS):
                peer = HOSTS[(i + 1) % len(HOSTS)]
                seq += 1
                got, _ = _order(probes[h], seq, {peer: probes[peer]})
                pairs[tuple(sorted((h, peer)))] = got[peer]
            lows.append(min(pairs.values()) / max(pairs.values()))
            found = slow_host(pairs)
            name = None if found is None else found.host
            suspects += name is not None
            confirmed += name is not None and name == last
            last = name
    finally:
        for hog in hogs:
            hog.kill()
        for p in probes.values():
            p.close()
    return {"sweeps": sweeps, "suspects": suspects, "confirmed": confirmed, "worst_ratio": min(lows)}


def heartbeat_cost() -> dict:
    report = LinkReport(41234, 7, (("127.0.0.2[0]#2", 1234.5), ("127.0.0.3[0]#3", 987.6)))
    plain = PollRequest(3, 1, 0, 10, 10, 55, 120, 0.0, 0.012)
    full = PollRequest(3, 1, 0, 10, 10, 55, 120, 0.0, 0.012, comm_s=0.004, link=report)
    n = 20000
    started = time.perf_counter()
    for _ in range(n):
        PollRequest.from_wire(json.loads(json.dumps(full.to_wire())))
    with_link = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        PollRequest.from_wire(json.loads(json.dumps(plain.to_wire())))
    without = (time.perf_counter() - started) / n
    return {"bytes": len(json.dumps(full.to_wire())) - len(json.dumps(plain.to_wire())),
            "extra_us": (with_link - without) * 1e6}


def job_runs(n: int) -> list[dict]:
    """Times of real jobs: first round formed -> slow_link event -> the round without the slow host."""
    runs = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as tmp:
            events, stop = Path(tmp) / "events.jsonl", Path(tmp) / "stop"
            script = ('if [ "$CLOUD_ELASTIC_HOSTNAME" = 127.0.0.3 ]; then '
                      'export CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S=20000; fi; '
                      f'exec {PY} {REPO / "tests/integration/probe.py"} --steps 20 --step-sleep 0.02 '
                      f'--stop-when {stop}')
            proc = subprocess.Popen([PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "2", "-H",
                                     ",".join(f"{h}:1" for h in HOSTS), "--events-file", str(events),
                                     "sh", "-c", script], cwd=REPO, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            deadline, seen = time.monotonic() + 120, {}
            while time.monotonic() < deadline and "after" not in seen:
                time.sleep(0.2)
                lines = events.read_text().splitlines() if events.exists() else []
                for e in map(json.loads, lines):
                    if e["event"] == "round_formed" and e["size"] == 3:
                        seen.setdefault("formed", e["ts"])
                    elif e["event"] == "slow_link":
                        seen.setdefault("named", e["ts"])
                        seen.setdefault("mb_s", (e["mb_s"], e["peers_mb_s"]))
                    elif e["event"] == "round_formed" and "named" in seen:
                        seen.setdefault("after", e["ts"])
                    elif e["event"] in ("rollback", "straggler"):
                        seen[e["event"]] = True
            stop.touch()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            if "after" in seen:
                runs.append({"named_s": seen["named"] - seen["formed"], "after_s": seen["after"] - seen["named"],
                             "mb_s": seen["mb_s"], "rollbacks": int("rollback" in seen),
                             "stragglers": int("straggler" in seen)})
            else:
                runs.append({"named_s": float("inf"), "after_s": float("inf"), "mb_s": (0, 0), "rollbacks": 0,
                             "stragglers": 0})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=None, help="real jobs to time (default 5; --quick 1)")
    docsection.add_arguments(parser)
    args = parser.parse_args()
    cost = probe_cost(5 if args.quick else 30)
    quiet = noise(5 if args.quick else 50)
    beat = heartbeat_cost()
    runs = job_runs(args.jobs if args.jobs is not None else (1 if args.quick else 5))
    h = cost["healthy"]
    rows = ["| peer | time per peer | figure |", "|---|---|---|",
            f"| healthy (median of {5 if args.quick else 30}; p95 {h['p95_s'] * 1e3:.1f} ms) | "
            f"{h['time_s'] * 1e3:.1f} ms | {h['mb_s']:.0f} MB/s (least {h['min_mb_s']:.0f}) |"]
    for rate in ("1e+07", "1e+06", "200000", "20000"):
        rows.append(f"| with the hook at {float(rate) / 1e6:g} MB/s | {cost[rate]['time_s'] * 1e3:.0f} ms | "
                    f"{cost[rate]['mb_s']:.2f} MB/s |")
    named = [r["named_s"] for r in runs]
    after = [r["after_s"] for r in runs]
    text = (f"{stamp(command())}\n\n" + "\n".join(rows) + "\n\n"
            f"Beside two CPU hogs, {quiet['sweeps']} sweeps of the three healthy pairs: {quiet['suspects']} named "
            f"a suspect, {quiet['confirmed']} would have been confirmed (the rule needs {LINK_FACTOR:g}x; the "
            f"slowest pair of a sweep was never below {quiet['worst_ratio']:.2f} of its fastest). A heartbeat "
            f"carries {beat['bytes']} more bytes with a link report of two peers and its time in collectives, "
            f"{beat['extra_us']:.1f} µs more to build and parse. A job of three, the hook at 0.02 MB/s on one "
            f"({len(runs)} run(s)): the slow host named {statistics.median(named):.1f} s (max {max(named):.1f} s) "
            f"after the first round formed, the round without it {statistics.median(after):.1f} s "
            f"(max {max(after):.1f} s) later; {sum(r['rollbacks'] for r in runs)} run(s) rolled back, "
            f"{sum(r['stragglers'] for r in runs)} named a straggler.")
    docsection.publish(args, "slow_link", SECTION, text)


if __name__ == "__main__":
    sys.exit(main())
