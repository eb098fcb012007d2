"""A seeded random schedule of faults, and the runner that inflicts it on a live job.

The schedule is drawn from the seed alone (:func:`plan`), before the job
starts; each step names a kind of fault, the pause before it, a number in
[0, 1) that picks its target among the candidates alive at that moment, and a
duration. Replaying a seed replays the same faults in the same order; which
worker a pick lands on can differ only if the job itself behaved differently.

A step whose fault cannot be applied safely at its moment (killing the last
worker that holds the trained state would legitimately end the job) waits
until it can, for up to ``patience_s``; after that it is replaced by adding a
host back, or else by a discovery error, so every step does something. (A
host to add back when none is absent is replaced at once: only the schedule
removes hosts.)

A driver restart SIGKILLs the driver and runs the same command again; the new
driver must adopt the running workers, and the schedule goes on against it.
Since an adopted worker's output went to the dead driver, the workers' events
are read from their own files (``chaos_probe.py --events-dir``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.integration.harness import EventFiles, Job, processes_of_job

#: The faults, with their weights in a schedule.
KINDS: dict[str, int] = {
    "kill9": 3,             # SIGKILL of one worker
    "sigstop": 3,           # SIGSTOP of one worker, SIGCONT after a while (shorter or longer than the heartbeat timeout)
    "spot_notice": 2,       # a Spot interruption notice on a host's metadata service; the host goes once its worker left
    "host_removed": 2,      # the host vanishes from discovery (its worker leaves after --host-missing-grace)
    "host_added": 3,        # a host absent from discovery comes back (a new instance)
    "discovery_error": 1,   # the discovery script fails for a while
    "discovery_empty": 1,   # the discovery script answers nothing for a while (shorter than the grace)
    # SIGKILL of the driver, the same command started again (at once, or after a
    # delay within --driver-grace): it adopts the running workers. Weight 2 puts
    # restarts into the CI seed's 20 steps (test_schedule.py keeps it so).
    "driver_restart": 2,
}


@dataclass(frozen=True)
class Step:
    kind: str
    pause_s: float   # before the step
    pick: float      # in [0, 1): which candidate target
    duration_s: float


#: A third of the driver restarts wait before starting the driver again (a crash
#: the supervisor notices late): longer than the heartbeat timeout, within the grace.
DELAYED_RESTARTS = 1 / 3


def plan(seed: int, count: int, *, heartbeat_timeout_s: float, missing_grace_s: float,
         driver_grace_s: float = 30.0) -> list[Step]:
    """``count`` steps drawn from ``seed`` only.

    A ``driver_restart``'s duration is the delay before the driver is started
    again: 0, or (for the steps whose pick is in the top :data:`DELAYED_RESTARTS`)
    1.5-4 heartbeat timeouts, at most a third of ``driver_grace_s``."""
    rng = random.Random(seed)
    kinds = [k for k, w in KINDS.items() for _ in range(w)]
    steps = []
    for _ in range(count):
        kind = rng.choice(kinds)
        if kind == "sigstop":
            # Half of the stops end before the heartbeat timeout (no one may be
            # declared lost), half after it (the worker is given up).
            short = rng.random() < 0.5
            duration = (rng.uniform(0.2, 0.4) if short else rng.uniform(1.2, 2.0)) * heartbeat_timeout_s
        elif kind == "discovery_empty":
            duration = rng.uniform(0.2, 0.5) * missing_grace_s
        elif kind == "discovery_error":
            duration = rng.uniform(0.5, 3.0)
        else:
            duration = 0.0
        pause, pick = rng.uniform(0.3, 2.5), rng.random()
        if kind == "driver_restart" and pick >= 1 - DELAYED_RESTARTS:
            # From the pick alone (a restart has no target to pick), so no extra draw shifts the later steps.
            delay = (1.5 + 2.5 * (pick - (1 - DELAYED_RESTARTS)) / DELAYED_RESTARTS) * heartbeat_timeout_s
            duration = min(delay, driver_grace_s / 3)
        steps.append(Step(kind, pause, pick, round(duration, 3)))
    return steps


class ChaosDiscovery:
    """A discovery script the test controls: the hosts it prints, an empty answer, or a failure."""

    def __init__(self, directory: Path, hosts: list[str]) -> None:
        self.file = directory / "hosts.txt"
        self.flag = directory / "discovery-fails"
        self.script = directory / "discover.sh"
        self.script.write_text(
            "#!/bin/sh\n"
            f"if [ -e '{self.flag}' ]; then echo 'chaos: discovery is failing' >&2; exit 1; fi\n"
            f"cat '{self.file}'\n"
        )
        self.script.chmod(0o755)
        self.hosts: list[str] = []
        self.set(hosts)

    def set(self, hosts: list[str]) -> None:
        self.hosts = list(hosts)
        self._write(self.hosts)

    def _write(self, hosts: list[str]) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text("".join(f"{h}:1\n" for h in hosts))
        tmp.replace(self.file)

    def empty_for(self, seconds: float) -> None:
        self._write([])
        time.sleep(seconds)
        self._write(self.hosts)

    def fail_for(self, seconds: float) -> None:
        self.flag.touch()
        time.sleep(seconds)
        self.flag.unlink()


@dataclass
class Chaos:
    """Applies :class:`Step`s to a running :class:`Job` on loopback hosts with one slot each.

    What the workers did is read from their event files (``worker_events``),
    not from the driver's output: after a driver restart the adopted workers'
    output is gone with the dead driver. ``job`` is the driver running now;
    ``start_driver`` runs the job's command again (same arguments and
    environment), and ``drivers`` lists every driver started, oldest first."""

    job: Job
    discovery: ChaosDiscovery
    all_hosts: list[str]
    notices: dict  # host -> FakeAWSMetadata
    events_file: Path  # the driver's --events-file (appended by every driver of the job)
    worker_events: EventFiles
    start_driver: Callable[[], Job]
    log: Callable[[str], None] = print
    drivers: list = field(default_factory=list)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.job_id = self.job.job_id()  # the same across restarts; a new driver prints it a moment later
        assert self.job_id, "the driver has not named its job yet"
        self.drivers = self.drivers or [self.job]
    applied: list[str] = field(default_factory=list)
    leaving: set = field(default_factory=set)   # worker ids told (or about) to leave
    stopped: set = field(default_factory=set)   # pids under SIGSTOP right now
    patience_s: float = 30.0                    # how long a step waits until it can be applied safely

    # ------------------------------------------------------------ the job's workers
    def live_workers(self) -> dict[str, tuple[int, str]]:
        """worker id -> (pid, host) of every worker process alive now."""
        alive = set(processes_of_job(self.job_id))
        out = {}
        for e in self.worker_events.of("hello"):
            if e["pid"] in alive:
                out[e["worker"]] = (e["pid"], e["worker"].split("[")[0])
        return out

    def holders(self) -> dict[str, tuple[int, str]]:
        """Live workers that hold the trained state and are staying: they have committed,
        are not stopped, and their host is in discovery and not told to go."""
        committed = set(self.worker_events.latest("commit"))
        return {w: ph for w, ph in self.live_workers().items()
                if w in committed and w not in self.leaving and ph[0] not in self.stopped
                and ph[1] in self.discovery.hosts}

    def _pick(self, candidates: list, pick: float):
        return sorted(candidates)[int(pick * len(candidates))]

    # ------------------------------------------------------------------ applying
    def apply(self, step: Step) -> str:
        time.sleep(step.pause_s)
        done = getattr(self, step.kind)(step)
        deadline = time.monotonic() + self.patience_s  # real time: a long soak makes each look slower
        while (done is None and time.monotonic() < deadline and len(self.discovery.hosts) >= 2
               and step.kind != "host_added"):
            # Wait for the job to recover (a replacement to commit) rather than
            # change the schedule: a replay then inflicts the same faults. (With
            # one host left in discovery, or no host to add back, which only
            # the schedule changes, waiting cannot help.)
            time.sleep(0.25)
            done = getattr(self, step.kind)(step)
        if done is None:  # not safe now: do something that always is
            absent = [h for h in self.all_hosts if h not in self.discovery.hosts]
            done = self.host_added(step) if absent else self.discovery_error(Step("discovery_error", 0, 0, 1.0))
            done = f"{done} (instead of {step.kind})"
        line = f"{time.strftime('%H:%M:%S')} {done}"
        self.applied.append(line)
        self.log(f"chaos: {line}")
        return done

    def kill9(self, step: Step) -> str | None:
        holders = self.holders()
        if len(holders) < 2:
            return None
        worker = self._pick(list(holders), step.pick)
        os.kill(holders[worker][0], signal.SIGKILL)
        self.leaving.add(worker)
        return f"kill -9 {worker}"

    def sigstop(self, step: Step) -> str | None:
        holders = self.holders()
        if len(holders) < 2:
            return None
        worker = self._pick(list(holders), step.pick)
        pid = holders[worker][0]
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        try:
            time.sleep(step.duration_s)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped.discard(pid)
        return f"SIGSTOP {worker} for {step.duration_s:.2f}s"

    def _host_of_holder(self, step: Step) -> str | None:
        holders = self.holders()
        hosts = sorted({h for _, h in holders.values()})
        if len(hosts) < 2:
            return None
        return self._pick(hosts, step.pick)

    def spot_notice(self, step: Step) -> str | None:
        host = self._host_of_holder(step)
        if host is None:
            return None
        for w, (_, h) in self.live_workers().items():
            if h == host:
                self.leaving.add(w)
        self.notices[host].set_spot_action("terminate", time.time() + 120)
        # The instance goes once the job let its workers leave (as a lifecycle
        # hook would hold it), or after 30 s whatever they do.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(h == host for _, h in self.live_workers().values()):
            time.sleep(0.1)
        left = not any(h == host for _, h in self.live_workers().values())
        since = time.time()
        self.discovery.set([h for h in self.discovery.hosts if h != host])
        self._wait_removed(host, since)
        self.notices[host].set_raw_spot_action(None)
        return f"spot notice on {host}; " + ("its worker left, host gone" if left else "worker still there after 30 s, host gone")

    def _wait_removed(self, host: str, since: float, timeout: float = 15.0) -> None:
        """Until the driver has seen ``host`` leave discovery: a terminated instance does not come
        back under its address before the driver noticed it was gone (its notice would still apply)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.driver_events(since - 0.01):
                if e["event"] == "hosts_changed" and any(r["host"] == host for r in e.get("removed", [])):
                    return
            time.sleep(0.1)
        raise AssertionError(f"the driver did not see {host} leave discovery within {timeout}s")

    def host_removed(self, step: Step) -> str | None:
        host = self._host_of_holder(step)
        if host is None:
            return None
        for w, (_, h) in self.live_workers().items():
            if h == host:
                self.leaving.add(w)
        self.discovery.set([h for h in self.discovery.hosts if h != host])
        return f"host {host} removed from discovery"

    def host_added(self, step: Step) -> str | None:
        absent = [h for h in self.all_hosts if h not in self.discovery.hosts]
        if not absent:
            return None
        host = self._pick(absent, step.pick)
        self.discovery.set(sorted(self.discovery.hosts + [host]))
        return f"host {host} added to discovery"

    def discovery_error(self, step: Step) -> str:
        self.discovery.fail_for(step.duration_s)
        return f"discovery failing for {step.duration_s:.2f}s"

    def discovery_empty(self, step: Step) -> str:
        self.discovery.empty_for(step.duration_s)
        return f"discovery answering nothing for {step.duration_s:.2f}s"

    def driver_events(self, since: float = 0.0) -> list[dict]:
        """The job's driver events (of every driver so far) stamped ``since`` or later; a line
        still being written is left out."""
        if not self.events_file.exists():
            return []
        text = self.events_file.read_text()
        job_id = self.job_id
        out = []
        for line in text[:text.rfind("\n") + 1].splitlines():
            e = json.loads(line)
            if e.get("job") == job_id and e["ts"] >= since:
                out.append(e)
        return out

    def driver_restart(self, step: Step) -> str | None:
        """SIGKILL the driver and run its command again, at once or after ``step.duration_s``; the new
        driver must adopt the running workers (every one that held the trained state) and they go on
        committing under it. Returns once they did, so the next fault meets the new driver."""
        holders = self.holders()
        if not holders:
            return None  # nobody to adopt: the restart would be the checkpoint resume, not this fault
        # A worker the driver already gave up (a long SIGSTOP, say) is not its to hand over.
        given_up = {e["worker"] for e in self.driver_events() if e["event"] in ("worker_failed", "worker_left")}
        expected = set(holders) - given_up
        old = self.job
        since = time.time()
        os.kill(old.proc.pid, signal.SIGKILL)
        old.proc.wait()
        if step.duration_s:
            time.sleep(step.duration_s)
        self.job = self.start_driver()
        self.drivers.append(self.job)
        self.restarts += 1
        done = self._wait(lambda: next((e for e in self.driver_events(since) if e["event"] == "adoption_done"), None),
                          60, "the restarted driver's adoption")
        adopted = {e["worker"] for e in self.driver_events(since) if e["event"] == "worker_adopted"}
        assert done["adopted"] >= 1 and expected <= adopted, (
            f"the restarted driver did not adopt every worker that held the trained state: "
            f"{sorted(expected - adopted)} not adopted (adoption_done: {done})\n{self.job.output()}")
        adopted_at = time.time()

        def committed_since() -> set:
            return {w for w, e in self.worker_events.latest("commit").items() if e["t"] > adopted_at}

        self._wait(lambda: expected <= committed_since(), 60,
                   f"the adopted workers {sorted(expected)} committing under the restarted driver")
        # Rollbacks are allowed here (a worker killed just before may be missing), but shown: a restart
        # that finds its round complete should need none.
        rollbacks = [e for e in self.driver_events(since) if e["event"] == "rollback"]
        delay = f"after {step.duration_s:.2f}s" if step.duration_s else "at once"
        return (f"driver restarted {delay}: adopted {done['adopted']} in round {done['round']}"
                + (f", missing {done['missing']}" if done["missing"] else "")
                + (f", {len(rollbacks)} rollback(s) ({sum(e.get('steps_lost', 0) for e in rollbacks)} steps lost)"
                   if rollbacks else ", no rollback"))

    def _wait(self, predicate: Callable[[], object], timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.job.proc.poll() is not None:
                raise AssertionError(f"the driver ended (rc={self.job.proc.returncode}) before {what}:\n"
                                     f"{self.job.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{self.job.output()}")
            time.sleep(0.2)

    def restore(self) -> None:
        """Every host back, discovery healthy, nothing stopped: the job may grow to full size again."""
        for pid in list(self.stopped):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped.clear()
        if self.discovery.flag.exists():
            self.discovery.flag.unlink()
        for fake in self.notices.values():
            fake.set_raw_spot_action(None)
        self.discovery.set(list(self.all_hosts))
