"""One cloud-elastic run through a ``kill -9``, a Spot notice and a scale-up, drawn as a timeline.

Three loopback hosts found by a discovery script, a fake AWS metadata service per
host (``tests/emulator/fake_metadata.py``) for the notice. The run: steady steps,
``kill -9`` of one worker (its slot is blocked for 300 s, so the job goes on at
two), a Spot notice on another host (its worker leaves at the next commit; the
host then leaves discovery), then both hosts come back (a new host: scale-up).
The figure shows the step and the world size over time, with the faults
marked; the same data goes to ``timeline.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from tests.chaos.schedule import ChaosDiscovery  # noqa: E402
from tests.emulator.fake_metadata import FakeAWSMetadata, per_host  # noqa: E402
from tests.integration.harness import Job  # noqa: E402

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]


def steplogs(job: Job) -> list[dict]:
    out = []
    for line in job.lines:
        i = line.find("STEPLOG ")
        if i >= 0:
            out.append(json.loads(line[i + 8:]))
    return out


def wait_steps(job: Job, n: int, size: int | None = None, timeout: float = 180) -> None:
    start = len(steplogs(job))
    job.wait_for(lambda j: len([e for e in steplogs(j)[start:] if e["rank"] == 0 and (size is None or e["size"] == size)]) >= n,
                 timeout, f"{n} steps" + (f" at size {size}" if size else ""))


def run(out_dir: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp, per_host(FakeAWSMetadata, HOSTS) as fakes:
        tmp = Path(tmp)
        discovery = ChaosDiscovery(tmp, HOSTS)
        port = next(iter(fakes.values())).port
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{{host}}:{port}", "AWS_EC2_METADATA_DISABLED": "false",
               "OMP_NUM_THREADS": "1"}
        job = Job(["run", "-np", "3", "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(discovery.script),
                   "--discovery-interval", "0.5", "--blacklist-cooldown-range", "300", "300", "--notice-watcher", "aws",
                   sys.executable, str(HERE / "workload.py"), "elastic", *MODEL, "--step-log"], env=env)
        marks: list[tuple[float, str]] = []
        try:
            wait_steps(job, 60, size=3)
            victim = next(e for e in reversed(steplogs(job)) if e["rank"] == 2)
            marks.append((time.time(), "kill -9"))
            os.kill(victim["pid"], signal.SIGKILL)
            wait_steps(job, 60, size=2)
            noticed = next(e for e in reversed(steplogs(job)) if e["rank"] == 1)
            host = _host_of_pid(noticed["pid"])
            marks.append((time.time(), "spot notice"))
            fakes[host].set_spot_action("terminate", time.time() + 120)
            wait_steps(job, 30, size=1)
            discovery.set([h for h in HOSTS if h != host])
            time.sleep(3)
            fakes[host].set_raw_spot_action(None)
            # Two hosts come back: the killed worker's slot by a new instance address, the drained host.
            marks.append((time.time(), "hosts added"))
            discovery.set(HOSTS)
            wait_steps(job, 60, size=2, timeout=240)
            wait_steps(job, 30)
        finally:
            job.kill()
        logs = [e for e in steplogs(job) if e["rank"] == 0]
        return {"steps": [(e["t"], e["step"], e["size"]) for e in logs], "marks": marks}


def _host_of_pid(pid: int) -> str:
    """The loopback address a worker's environment names as its host."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in env:
        if item.startswith(b"CLOUD_ELASTIC_WORKER_ID="):
            return item.split(b"=", 1)[1].decode().split("[")[0]
    raise RuntimeError(f"no worker id in the environment of {pid}")


def draw(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = data["steps"][0][0]
    ts = [t - t0 for t, _, _ in data["steps"]]
    fig, (a, b) = plt.subplots(2, 1, sharex=True, figsize=(9, 4.5), gridspec_kw={"height_ratios": [3, 1]})
    a.plot(ts, [s for _, s, _ in data["steps"]], ".", markersize=2)
    a.set_ylabel("step (rank 0)")
    b.step(ts, [n for _, _, n in data["steps"]], where="post")
    b.set_ylabel("world size")
    b.set_ylim(0, 3.5)
    b.set_xlabel("seconds")
    for t, label in data["marks"]:
        for ax in (a, b):
            ax.axvline(t - t0, color="tab:red", linestyle="--", linewidth=1)
        a.annotate(label, (t - t0, a.get_ylim()[1]), rotation=90, va="top", ha="right", fontsize=8, color="tab:red")
    a.set_title("cloud-elastic through a kill -9, a Spot notice and a scale-up (3 loopback hosts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    out = REPO / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    data = run(out)
    (HERE / "timeline.json").write_text(json.dumps(data) + "\n")
    draw(data, out / "peers_timeline.png")
    print(f"wrote {out / 'peers_timeline.png'}")
