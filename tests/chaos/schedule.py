"""A seeded random schedule of faults, and the runner that inflicts it on a live job.

The schedule is drawn from the seed alone (:func:`plan`), before the job
starts; each step names a kind of fault, the pause before it, a number in
[0, 1) that picks its target among the candidates alive at that moment, and a
duration. Replaying a seed replays the same faults in the same order; which
worker a pick lands on can differ only if the job itself behaved differently.
A plan of 20 steps or more holds every kind of :data:`ISSUE_KINDS` (a third of
the seeds would miss one in 20 draws).

A step whose fault cannot be applied safely at its moment (killing the last
worker that holds the trained state would legitimately end the job) waits
until it can, for up to ``patience_s``; after that it is replaced by a fault
that is safe then, so every step does something. The replacement is a kind
the run has not applied yet if one is safe (so a short run still inflicts
every kind of :data:`ISSUE_KINDS`; the test asserts it on :attr:`Chaos.applied`),
else adding a host back, else a discovery error. (A host to add back when
none is absent is replaced at once: only the schedule removes hosts.) A
replacement's duration is drawn from the replaced step's pick, so the faults
stay a function of the seed and of what the job did.

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
from collections import Counter
from dataclasses import dataclass, field, replace
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


#: The fault kinds the issue asks for, as :func:`issue_kind` names them: every run of 20
#: steps or more must apply each at least once.
ISSUE_KINDS: dict[str, str] = {
    "kill9": "kill -9",
    "sigstop": "SIGSTOP and resume",
    "spot_notice": "spot notice",
    "host_removed": "host removed",
    "host_added": "host added",
    "discovery": "discovery error or empty answer",
    "driver_restart": "driver restart",
}


def issue_kind(kind: str) -> str:
    """The :data:`ISSUE_KINDS` key of a :data:`KINDS` kind: a discovery error and an empty answer are one."""
    return "discovery" if kind.startswith("discovery_") else kind


@dataclass(frozen=True)
class Step:
    kind: str
    pause_s: float   # before the step
    pick: float      # in [0, 1): which candidate target
    duration_s: float


@dataclass(frozen=True)
class Timing:
    """The job's timeouts that the faults' durations are drawn against."""

    heartbeat_timeout_s: float
    missing_grace_s: float
    driver_grace_s: float = 30.0


@dataclass(frozen=True)
class Applied:
    """One fault the runner inflicted: its kind (a :data:`KINDS` key), the kind the schedule had
    drawn for that step (different when it was replaced), and the line it logged."""

    kind: str
    planned: str
    text: str


#: A third of the driver restarts wait before starting the driver again (a crash
#: the supervisor notices late): longer than the heartbeat timeout, within the grace.
DELAYED_RESTARTS = 1 / 3


def plan(seed: int, count: int, timing: Timing) -> list[Step]:
    """``count`` steps drawn from ``seed`` only; from :data:`COVERED` steps on, every kind of
    :data:`ISSUE_KINDS` among them (see :func:`_cover`).

    A ``driver_restart``'s duration is the delay before the driver is started
    again: 0, or (for the steps whose pick is in the top :data:`DELAYED_RESTARTS`)
    1.5-4 heartbeat timeouts, at most a third of ``driver_grace_s``."""
    rng = random.Random(seed)
    kinds = [k for k, w in KINDS.items() for _ in range(w)]
    steps = []
    for _ in range(count):
        kind = rng.choice(kinds)
        duration = _duration(kind, rng, timing)
        pause, pick = rng.uniform(0.3, 2.5), rng.random()
        if kind == "driver_restart":
            duration = _restart_delay(pick, timing)
        steps.append(Step(kind, pause, pick, round(duration, 3)))
    return _cover(steps, timing) if count >= COVERED else steps


#: From this many steps on, a plan holds every kind of :data:`ISSUE_KINDS`.
COVERED = 20


def _cover(steps: list[Step], timing: Timing) -> list[Step]:
    """A kind the draw missed takes the place of the last step of the most frequent kind (which has
    three steps or more in 20), keeping its pause and pick: a seed that drew every kind is unchanged."""
    steps = list(steps)
    for kind in ISSUE_KINDS:
        counts = Counter(issue_kind(s.kind) for s in steps)
        if counts[kind]:
            continue
        most = max(ISSUE_KINDS, key=lambda k: counts[k])  # the first of the most frequent: deterministic
        i = max(n for n, s in enumerate(steps) if issue_kind(s.kind) == most)
        concrete = "discovery_error" if kind == "discovery" else kind
        steps[i] = replace(stand_in(concrete, steps[i], timing), pause_s=steps[i].pause_s)
    return steps


def stand_in(kind: str, step: Step, timing: Timing) -> Step:
    """The step that replaces ``step`` by a fault of ``kind``: no pause, the same pick, a duration
    drawn from the pick (so a replay of the seed draws the same one)."""
    duration = _duration(kind, random.Random(step.pick), timing)
    if kind == "driver_restart":
        duration = _restart_delay(step.pick, timing)
    return Step(kind, 0.0, step.pick, round(duration, 3))


def _duration(kind: str, rng: random.Random, timing: Timing) -> float:
    if kind == "sigstop":
        # Half of the stops end before the heartbeat timeout (no one may be
        # declared lost), half after it (the worker is given up).
        short = rng.random() < 0.5
        return (rng.uniform(0.2, 0.4) if short else rng.uniform(1.2, 2.0)) * timing.heartbeat_timeout_s
    if kind == "discovery_empty":
        return rng.uniform(0.2, 0.5) * timing.missing_grace_s
    if kind == "discovery_error":
        return rng.uniform(0.5, 3.0)
    return 0.0


def _restart_delay(pick: float, timing: Timing) -> float:
    # From the pick alone (a restart has no target to pick), so no extra draw shifts the later steps.
    if pick < 1 - DELAYED_RESTARTS:
        return 0.0
    delay = (1.5 + 2.5 * (pick - (1 - DELAYED_RESTARTS)) / DELAYED_RESTARTS) * timing.heartbeat_timeout_s
    return min(delay, timing.driver_grace_s / 3)


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
    timing: Timing
    log: Callable[[str], None] = print
    drivers: list = field(default_factory=list)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.job_id = self.job.job_id()  # the same across restarts; a new driver prints it a moment later
        assert self.job_id, "the driver has not named its job yet"
        self.drivers = self.drivers or [self.job]
    applied: list[Applied] = field(default_factory=list)
    leaving: set = field(default_factory=set)   # worker ids told (or about) to leave
    # worker id -> (host, when it was removed) for a live worker of a host removed and added back
    returning: dict = field(default_factory=dict)
    removed_at: dict = field(default_factory=dict)  # host -> when host_removed took it out of discovery
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
        committed = self.worker_events.latest("commit")
        self._readmit(committed)
        return {w: ph for w, ph in self.live_workers().items()
                if w in committed and w not in self.leaving and ph[0] not in self.stopped
                and ph[1] in self.discovery.hosts}

    def _readmit(self, committed: dict) -> None:
        """A worker whose host was removed and added back within the missing-host grace stays in the
        job, so it is a target again (else a long run runs out of targets and replaces its faults):
        once it committed after that grace ran out, if the driver never dropped its host or it."""
        for worker, (host, since) in list(self.returning.items()):
            commit = committed.get(worker)
            if commit is None or commit["t"] <= since + self.timing.missing_grace_s + 1.0:
                continue
            del self.returning[worker]
            if not any(_drops(e, host, worker) for e in self.driver_events(since)):
                self.leaving.discard(worker)

    def _mark_leaving(self, host: str) -> None:
        for w, (_, h) in self.live_workers().items():
            if h == host:
                self.leaving.add(w)
                self.returning.pop(w, None)

    def _pick(self, candidates: list, pick: float):
        return sorted(candidates)[int(pick * len(candidates))]

    # ------------------------------------------------------------------ applying
    def apply(self, step: Step) -> Applied:
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
        kind = step.kind
        if done is None:  # not safe now: do something that is
            kind, done = self._replace(step)
            done = f"{done} (instead of {step.kind})"
        applied = Applied(kind, step.kind, f"{time.strftime('%H:%M:%S')} {done}")
        self.applied.append(applied)
        self.log(f"chaos: {applied.text}")
        return applied

    def _replace(self, step: Step) -> tuple[str, str]:
        """A fault that is safe now instead of ``step``, as (kind, what was done): the first kind of
        :data:`KINDS` this run has not applied yet that is safe now, else a host added back, else a
        discovery error (always safe)."""
        done_kinds = {issue_kind(a.kind) for a in self.applied}
        fresh = [k for k in KINDS if issue_kind(k) not in done_kinds and k != step.kind]
        for kind in fresh + ["host_added", "discovery_error"]:
            done = getattr(self, kind)(stand_in(kind, step, self.timing))
            if done is not None:
                return kind, done
        raise AssertionError("unreachable: a discovery error is always safe")

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
        self._mark_leaving(host)
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
        self._mark_leaving(host)
        self.removed_at[host] = time.time()
        self.discovery.set([h for h in self.discovery.hosts if h != host])
        return f"host {host} removed from discovery"

    def host_added(self, step: Step) -> str | None:
        absent = [h for h in self.all_hosts if h not in self.discovery.hosts]
        if not absent:
            return None
        host = self._pick(absent, step.pick)
        since = self.removed_at.pop(host, None)
        if since is not None:  # removed by host_removed, not after a notice: its worker may still be in the job
            for w, (_, h) in self.live_workers().items():
                if h == host and w in self.leaving:
                    self.returning[w] = (host, since)
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

    def make_up(self, template: Step) -> list[Applied]:
        """Each kind of :data:`ISSUE_KINDS` that was never applied (the plan holds every kind, but one that was
        not safe at its moment is replaced, and may not come round again), applied now. Call it once the job
        is whole again (after :meth:`restore`); steps are derived from ``template``'s pick, so a replay of the
        seed makes up the same ones. A host can only be added back once one is gone: one is removed first."""
        done = {issue_kind(a.kind) for a in self.applied}
        made = []
        for kind in ISSUE_KINDS:
            if kind in done:
                continue
            if kind == "host_added":
                made.append(self.apply(stand_in("host_removed", template, self.timing)))
            concrete = "discovery_error" if kind == "discovery" else kind
            made.append(self.apply(stand_in(concrete, template, self.timing)))
            done = {issue_kind(a.kind) for a in self.applied}
        return made

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


def _drops(event: dict, host: str, worker: str) -> bool:
    """Whether a driver event says the driver dropped ``host`` or let ``worker`` go."""
    if event["event"] == "hosts_changed":
        return any(r["host"] == host for r in event.get("removed", []))
    return event["event"] in ("worker_left", "worker_failed") and event.get("worker") == worker
