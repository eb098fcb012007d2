"""How the driver scales to a large group: 1,000 simulated hosts x 8 slots.

    .venv/bin/python benchmarks/driver_scale.py [--profile] [--quick]

A fake provider (a snapshot of H hosts with 8 slots each) feeds the driver's real
state machine (``driver/job/elastic_job.py:ElasticJob``); simulated workers walk through the
same calls the control-plane handlers make (register, rendezvous, assignment,
heartbeat). Measured:

1. one rendezvous round of 64, 256, 1,024 and 8,000 workers (8 a host), and of
   8,192 and 16,384 one-slot hosts: every member arrives, the round forms, every
   member collects its assignment, encoded and signed as the control plane sends
   it (``Codec.encode``); the largest reply's size too (``--only-rounds``: only this);
2. at steady state with 1,024 and 8,000 running workers: one discovery +
   planning cycle (``discovered`` + ``tick``), the first one (which plans every
   launch), and one loop tick alone (the driver ticks every 50 ms);
3. the control plane, answered at once: driver CPU per heartbeat through the real
   server and HMAC codec (``ControlServer``, ``Codec``), real clients
   (``DriverClient``, 16 threads) in another process;
4. the live driver: ``Driver._handle`` behind the real server, its loop ticking
   and discovery answering every second, 2,048 and 8,000 simulated workers
   long-polling their heartbeats (signed, one connection each, from one
   ``selectors`` client process, each simulated host from a loopback address of
   its own) as the worker's heartbeat thread does.
   Driver-process CPU per second and per heartbeat.

Driver CPU at 8,000 workers is measured live, and also estimated from its parts:
heartbeats (8,000 per hold time, ``Driver._poll_hold_s``, at the cost per
heartbeat of the largest live run), ticks (20 a second) and one discovery cycle
per second.

Targets (issue 15): less than one core at 8,000 workers; a cycle <= 0.1 s; a
round of 1,024 <= 2 s. ``--profile`` prints cProfile's top functions of the
state-machine parts and, with yappi installed (requirements/bench.txt), the
live driver's threads. Prints the results and writes a table into
docs/benchmarks.md (``docsection``: section ``driver-scale`` and its glance rows).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import pstats
import queue
import random
import resource
import sys
import threading
import time
from pathlib import Path

import docsection
from common import REPO, command, stamp, where

sys.path.insert(0, str(REPO))
from cloud_elastic.config import JobConfig  # noqa: E402
from cloud_elastic.control import MAX_BODY, Codec, new_secret  # noqa: E402
from cloud_elastic.driver.job.hosts import Blacklist, HostManager  # noqa: E402
from cloud_elastic.driver.job.elastic_job import Assignment, ElasticJob, Launch, Policy  # noqa: E402
from cloud_elastic.driver.net.control_server import ControlServer  # noqa: E402
from cloud_elastic.protocol import PollReply, PollRequest  # noqa: E402
from cloud_elastic.providers.api import DiscoveredHosts  # noqa: E402
from cloud_elastic.worker.link.client import DriverClient  # noqa: E402

SLOTS = 8


def snapshot(hosts: int, slots: int = SLOTS) -> DiscoveredHosts:
    return DiscoveredHosts(ready={f"10.{i // 250}.{i % 250}.7": slots for i in range(hosts)})


def profiled(fn, profile: bool, label: str):
    if not profile:
        return fn()
    prof = cProfile.Profile()
    out = prof.runcall(fn)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(18)
    print(f"--- profile: {label}\n{s.getvalue()}")
    return out


def running_job(hosts: int, slots: int = SLOTS) -> tuple[ElasticJob, list[str], float, float, int]:
    """A job of hosts x ``slots`` workers, all in round 1. Returns it, the worker ids, the seconds of the
    first discovery cycle and of the first round (its formation, and every assignment encoded and signed
    as the control plane sends it), and the bytes of the largest assignment sent."""
    n = hosts * slots
    job = ElasticJob(Policy(n, 1, n), HostManager(Blacklist((10, 300), random.Random(0))), job_id="scale")
    codec = Codec(new_secret(), "scale")
    now = 1000.0
    job.start(now)
    snap = snapshot(hosts, slots)
    t = time.perf_counter()
    job.discovered(snap, now)
    first_cycle = time.perf_counter() - t
    ids = [a.worker_id for a in job.take_actions() if isinstance(a, Launch)]
    assert len(ids) == n, f"{len(ids)} launches for {n} slots"
    t = time.process_time()  # this process's CPU (one thread): what a loaded machine does not inflate
    for w in ids:
        job.registered(w, now)
        job.rendezvous(w, 0, "start", now, addresses=(job.workers[w].slot.host,))  # its host's, as a worker gives
    largest = 0
    for w in ids:
        reply = job.assignment(w)
        assert isinstance(reply, Assignment), f"the first round did not form: {reply}"
        body, _ = codec.encode("rendezvous", dict(reply.to_wire(), re="0" * 24, to=w), limit=MAX_BODY)
        largest = max(largest, len(body))
    round_s = time.process_time() - t
    job.take_events()
    return job, ids, first_cycle, round_s, largest


def cycle_cost(job: ElasticJob, hosts: int, ids: list[str], repeats: int = 20) -> float:
    snap = snapshot(hosts)
    now = 1001.0
    times = []
    for i in range(repeats):
        for w in ids:  # every worker heartbeats between cycles, as in a live job
            job.heartbeat(w, now)
        t = time.perf_counter()
        job.discovered(snap, now)
        job.tick(now)
        times.append(time.perf_counter() - t)
        now += 0.5
        job.take_actions(), job.take_events()
    return sorted(times)[len(times) // 2]


def heartbeat_core_cost(job: ElasticJob, ids: list[str]) -> float:
    t = time.perf_counter()
    for w in ids:
        job.heartbeat(w, 1001.0)
    return (time.perf_counter() - t) / len(ids)


def _clients(port: int, secret: str, threads: int, seconds: float, out) -> None:
    import threading

    count = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        client = DriverClient(f"127.0.0.1:{port}", Codec(secret, "scale"), f"w{i}")
        n = 0
        while time.monotonic() < stop:
            client.call("poll", PollRequest(1, 0, 0, 0).to_wire())
            n += 1
        with lock:
            count[0] += n

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(count[0])


def control_plane_cost(job: ElasticJob, ids: list[str], seconds: float = 5.0, threads: int = 16) -> float:
    """Driver-process CPU seconds per heartbeat through the real server and codec."""
    secret = new_secret()

    def handler(kind: str, msg: dict) -> dict:
        reply = job.heartbeat(ids[hash(msg.get("worker")) % len(ids)], 1001.0)
        return (reply or PollReply(0, 0, 0, True)).to_wire()

    server = ControlServer(Codec(secret, "scale"), handler)
    server.start()
    try:
        q = multiprocessing.get_context("spawn").Queue()
        p = multiprocessing.get_context("spawn").Process(target=_clients, args=(server.port, secret, threads, seconds, q))
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        p.start()
        count = q.get(timeout=seconds + 60)
        p.join()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        server.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return cpu / max(1, count), count


#: How long a client keeps polling past its window for a worker the driver has not answered yet.
_ANSWER_GRACE_S = 30.0


def _pollers(port: int, secret: str, workers: list[str], window, go, out) -> None:
    """:func:`_poll` in a client process: ("ready",) once connected, then ("done", answered, failed, heard) into
    ``out``, or ("error", what went wrong): the parent says so at once."""
    try:
        out.put(("done", *_poll(port, secret, workers, window, go, out)))
    except Exception as exc:  # noqa: BLE001 (any failure ends the measurement; its text is the report)
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _poll(port: int, secret: str, workers: list[str], window, go, out) -> tuple[int, int, int]:
    """Simulated workers' heartbeats: each long-polls as ``WorkerContext._heartbeat_loop`` does (a
    new signed poll as soon as the last one is answered), all from one ``selectors`` loop so that
    thousands fit in one process without starving the driver of the machine's cores. Connects them
    all, says it is ready, waits for ``go``, then polls until ``window[1]``, counting the answers
    from ``window[0]`` (wall times the parent sets before ``go``), and on past it (for at most
    ``_ANSWER_GRACE_S``) until each simulated worker has had one answer: a driver starved through the
    whole window (a busy machine) still has to answer every worker. Returns (answers in the window,
    failed calls, workers answered at least once)."""
    import selectors
    import socket

    codec = Codec(secret, "scale")
    sel = selectors.DefaultSelector()
    answered = failed = 0

    class Sim:
        def __init__(self, worker: str) -> None:
            self.worker, self.seen, self.buf = worker, (1, 0, 0), bytearray()
            source = (loopback_of(worker.split("[")[0]), 0)
            self.sock = socket.create_connection(("127.0.0.1", port), source_address=source)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sel.register(self.sock, selectors.EVENT_READ, self)
            self.send()  # as a worker does: the driver closes connections that stay unsigned past a quota
            self.sock.setblocking(False)

        def send(self) -> None:
            body, signature = codec.encode("poll", dict(PollRequest(*self.seen, 1, 1).to_wire(), worker=self.worker))
            self.sock.sendall(b"POST /v1/poll HTTP/1.1\r\nHost: driver\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\nX-Cloud-Elastic-Signature: %s\r\n\r\n"
                              % (len(body), signature.encode()) + body)

    def loopback_of(host: str) -> str:
        """Each simulated host (``snapshot``'s 10.A.B.7) connects from an address of its own, 127.1.A.B+1, as a
        real fleet's workers come from their hosts' addresses."""
        _, a, b, _ = host.split(".")
        return f"127.1.{a}.{int(b) + 1}"

    sims = [Sim(w) for w in workers]  # noqa: F841 (each registered with the selector)
    heard: set[str] = set()
    out.put(("ready",))
    go.wait()
    while time.time() < window[1] or (len(heard) < len(sims) and time.time() < window[1] + _ANSWER_GRACE_S):
        for key, _ in sel.select(0.5):
            sim = key.data
            data = sim.sock.recv(65536)
            if not data:
                raise RuntimeError(f"the driver closed {sim.worker}'s connection")
            sim.buf += data
            end = sim.buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            head = bytes(sim.buf[:end]).lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if len(sim.buf) < end + 4 + length:
                continue
            body = bytes(sim.buf[end + 4:end + 4 + length])
            del sim.buf[:end + 4 + length]
            if not head.startswith(b"http/1.1 200"):
                failed += 1
            else:
                reply = PollReply.from_wire(json.loads(body))
                sim.seen = (reply.round, reply.update_gen, reply.abort_round)
                heard.add(sim.worker)
                if window[0] <= time.time() < window[1]:
                    answered += 1
            sim.send()
    return answered, failed, len(heard)


class _NoLaunch:
    """The simulated workers are already running: any launch is refused (nothing real may start)."""

    def launch(self, spec, on_output):
        from cloud_elastic.errors import LaunchError

        raise LaunchError(f"benchmark: not launching {spec.worker_id}")

    def close(self) -> None:
        pass


def _collect(q, ps: list, kind: str, timeout_s: float = 300.0) -> list[tuple]:
    """One ``kind`` message from each client process; RuntimeError with what went wrong when a client failed,
    or died (it could not start) or stayed silent without one."""
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < len(ps):
        try:
            msg = q.get(timeout=0.5)
        except queue.Empty:
            if all(p.exitcode is not None for p in ps) or time.monotonic() > deadline:
                raise RuntimeError(f"simulated workers: {len(ps) - len(out)} client process(es) sent no {kind!r} "
                                   f"(exit codes {[p.exitcode for p in ps]})") from None
            continue
        if msg[0] == "error":
            raise RuntimeError(f"simulated workers failed: {msg[1]}")
        out.append(msg)
    return out


def live_driver(workers: int, seconds: float = 10.0, procs: int | None = None, settle_s: float = 3.0) -> dict:
    """The real driver at steady state: ``Driver._handle`` (held heartbeats) behind the real server,
    its loop ticking every 50 ms, a discovery snapshot every ``discovery_interval_s``, ``workers``
    simulated workers long-polling from ``procs`` other processes. Driver-process CPU over a window, which
    starts ``settle_s`` after every client process has connected its workers."""
    from cloud_elastic.driver.runtime.driver import Driver
    from cloud_elastic.events import open_sinks

    hosts = workers // SLOTS
    config = JobConfig(command=("true",), num_proc=workers, min_np=1, max_np=workers, heartbeat_timeout_s=60.0)
    driver = Driver(config, discovery=type("Fake", (), {"name": "fake"})(), job_id="scale", launcher=_NoLaunch())
    driver._sinks = open_sinks("scale", None, None)
    driver._plane = driver._control_plane(None)
    job, snap = driver._job, snapshot(hosts)
    with driver._cond:
        job.start(driver._clock())
        job.discovered(snap, driver._clock())
        ids = [a.worker_id for a in job.take_actions() if isinstance(a, Launch)]
        for w in ids:
            job.registered(w, driver._clock())
            job.rendezvous(w, 0, "start", driver._clock())
        assert all(isinstance(job.assignment(w), Assignment) for w in ids)
        job.take_events()
    driver._endpoints.start("127.0.0.1", advertised="127.0.0.1")
    loop = threading.Thread(target=driver._loop, daemon=True)
    loop.start()
    stop = threading.Event()

    def discover() -> None:
        while not stop.wait(config.discovery_interval_s):
            driver._on_discovery(snap)

    threading.Thread(target=discover, daemon=True).start()
    procs = procs or (1 if workers <= 4000 else 2)  # one client process signs ~3,000 polls a second here
    ctx = multiprocessing.get_context("spawn")
    q, go, window = ctx.Queue(), ctx.Event(), ctx.Array("d", 2)
    ps = [ctx.Process(target=_pollers, args=(driver._endpoints.control_port, driver._endpoints.secret, ids[i::procs],
                                             window, go, q)) for i in range(procs)]
    try:
        for p in ps:
            p.start()
        _collect(q, ps, "ready")  # however long the clients take to import and connect on a busy machine
        now = time.time()
        window[0], window[1] = now + settle_s, now + settle_s + seconds
        go.set()
        time.sleep(max(0.0, window[0] - time.time()))
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        time.sleep(max(0.0, window[1] - time.time()))
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        answered = _collect(q, ps, "done")
    finally:
        go.set()  # a client still waiting stops at once: its window is past, or was never set
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.kill()
        stop.set()
        driver.stop("benchmark over", 0)
        loop.join(30)
        driver._endpoints.close()
    polls, failed, heard = (sum(m[i] for m in answered) for i in (1, 2, 3))
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    lost = sum(1 for w in job.workers.values() if w.state.value in ("lost", "exited"))
    return {"workers": workers, "cpu_s_per_s": (user + system) / (t1 - t0), "system_share": system / max(1e-9, user + system),
            "polls_per_s": polls / (t1 - t0), "cpu_per_poll_s": (user + system) / max(1, polls),
            "failed_calls": failed, "workers_lost": lost, "workers_answered": heard}


def tick_cost(job: ElasticJob, ids: list[str], repeats: int = 40) -> float:
    """Median seconds of one loop tick (``tick``: the driver calls it every 50 ms) at steady state."""
    now, times = 1001.0, []
    for _ in range(repeats):
        for w in ids[:: max(1, len(ids) // 100)]:  # some workers heartbeat between two ticks, as in a live job
            job.heartbeat(w, now)
        t = time.perf_counter()
        job.tick(now)
        times.append(time.perf_counter() - t)
        now += 0.05
    return sorted(times)[len(times) // 2]


def live_profiled(n: int, seconds: float, profile: bool) -> dict:
    if not profile:
        return live_driver(n, seconds)
    try:
        import yappi  # threads: cProfile sees only the calling thread
    except ImportError:
        print("--- profile of the live driver needs yappi (pip install -r requirements/bench.txt)")
        return live_driver(n, seconds)
    yappi.set_clock_type("cpu")
    yappi.start()
    try:
        out = live_driver(n, seconds)
    finally:
        yappi.stop()
    stats = yappi.get_func_stats().sort("tsub")
    print(f"--- profile: live driver at {n} workers (CPU seconds; own, with callees; calls)")
    for i, f in enumerate(stats):
        if i >= 25:
            break
        print(f"{f.tsub:8.3f} {f.ttot:8.3f} {f.ncall:9d}  {Path(f.module).name}:{f.lineno} {f.name}")
    yappi.clear_stats()
    return out


def main() -> None:
    from cloud_elastic.driver.runtime.control_plane import POLLS_PER_S
    from cloud_elastic.driver.runtime.driver import _TICK_S

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, nargs="+", default=[64, 256, 1024, 8000])
    p.add_argument("--one-slot-rounds", type=int, nargs="*", default=[8192, 16384],
                   help="rendezvous rounds of this many one-slot hosts")
    p.add_argument("--only-rounds", action="store_true", help="measure the rendezvous rounds only (docs untouched)")
    p.add_argument("--steady", type=int, nargs="+", default=[1024, 8000],
                   help="worker counts whose steady-state discovery cycle and tick are measured")
    p.add_argument("--live", type=int, nargs="+", default=[2048, 8000],
                   help="worker counts simulated against the live driver (one client process)")
    p.add_argument("--live-seconds", type=float, default=10.0)
    p.add_argument("--profile", action="store_true")
    docsection.add_arguments(p)
    args = p.parse_args()
    if args.quick:  # no 8,000: the figures at 8,000 are then estimated from 1,024
        args.rounds, args.steady, args.live, args.live_seconds = [64, 256, 1024], [1024], [2048], 3.0
        args.one_slot_rounds = []
    res: dict = {"slots_per_host": SLOTS, "rounds": {}, "one_slot_rounds": {}, "reply_bytes": {}, "steady": {},
                 "live": {}}
    for slots, counts, key in ((SLOTS, args.rounds, "rounds"), (1, args.one_slot_rounds, "one_slot_rounds")):
        for n in counts:
            _, _, _, round_s, largest = profiled(lambda: running_job(n // slots, slots),
                                                 args.profile and n == 1024 and slots > 1, f"round of {n}")
            res[key][n], res["reply_bytes"][f"{n}x{slots}"] = round_s, largest
            print(f"rendezvous round of {n} workers, {slots} a host: {round_s * 1000:.1f} ms of driver CPU; largest "
                  f"assignment {largest:,} bytes", flush=True)
    if args.only_rounds:
        return
    config = JobConfig(command=("true",), num_proc=1, min_np=1, max_np=1)
    interval, timeout = config.heartbeat_interval_s, config.heartbeat_timeout_s
    res["heartbeat_interval_s"], res["heartbeat_timeout_s"] = interval, timeout
    job = ids = None
    for n in args.steady:
        job, ids, first_cycle, round_s, _ = running_job(n // SLOTS)
        cycle = profiled(lambda: cycle_cost(job, n // SLOTS, ids), args.profile, f"steady cycle at {n}")
        res["steady"][n] = {"first_cycle_s": first_cycle, "round_s": round_s, "cycle_s": cycle,
                            "tick_s": tick_cost(job, ids), "heartbeat_core_s": heartbeat_core_cost(job, ids)}
        print(f"{n} workers: first discovery cycle (plans {n} launches) {first_cycle * 1000:.1f} ms; round "
              f"{round_s:.2f} s; steady discovery + planning cycle {cycle * 1000:.1f} ms; loop tick "
              f"{res['steady'][n]['tick_s'] * 1000:.2f} ms; heartbeat in the state machine "
              f"{res['steady'][n]['heartbeat_core_s'] * 1e6:.1f} us", flush=True)
    per_msg, count = control_plane_cost(job, ids)
    res["heartbeat_http_cpu_s"], res["heartbeat_http_count"] = per_msg, count
    print(f"a heartbeat through HTTP + HMAC, answered at once: {per_msg * 1e6:.0f} us of driver CPU "
          f"({count} messages, 16 client threads)", flush=True)
    for n in args.live:
        live = res["live"][n] = live_profiled(n, args.live_seconds, args.profile)
        print(f"live driver, {n} workers long-polling: {live['cpu_s_per_s']:.2f} cores, {live['polls_per_s']:.0f} "
              f"heartbeats/s, {live['cpu_per_poll_s'] * 1e6:.0f} us each ({live['system_share']:.0%} in the kernel), "
              f"{live['failed_calls']} failed calls, {live['workers_lost']} workers lost", flush=True)
    # At 8,000 workers: the heartbeats the driver holds for longer (ControlPlane.poll_hold_s) at the cost of one
    # heartbeat in the largest live run (its CPU less that run's ticks and discovery cycles), the loop's
    # ticks, and one discovery cycle per interval. A live run can fall short of the full heartbeat rate:
    # its client processes share the machine's two cores with the driver.
    n = 8000
    hold = max(interval, min(timeout / 4, n / POLLS_PER_S))
    steady = res["steady"].get(n) or res["steady"][max(res["steady"])]
    ticks = steady["tick_s"] / _TICK_S
    discovery = max(0.0, steady["cycle_s"] - steady["tick_s"]) / config.discovery_interval_s
    per_poll = per_msg
    if res["live"]:
        big = max(res["live"])
        live, at = res["live"][big], res["steady"].get(big) or steady
        overhead = at["tick_s"] / _TICK_S + max(0.0, at["cycle_s"] - at["tick_s"]) / config.discovery_interval_s
        per_poll = max(0.0, live["cpu_s_per_s"] - overhead) / max(1.0, live["polls_per_s"])
    parts = {"heartbeats": n / hold * per_poll, "ticks": ticks, "discovery": discovery}
    res["at_8000"] = dict(parts, hold_s=hold, heartbeats_per_s=n / hold, heartbeat_cpu_s=per_poll,
                          cores=sum(parts.values()))
    print(f"at 8,000 workers, estimated: heartbeats held {hold:.2f} s = {n / hold:.0f}/s x {per_poll * 1e6:.0f} us = "
          f"{parts['heartbeats']:.2f} cores; ticks {ticks:.2f}; discovery {discovery:.2f}; total "
          f"{sum(parts.values()):.2f} cores", flush=True)
    docsection.publish(args, "driver-scale", SECTION, f"{stamp(command())}\n\n{table(res)}", glance(res))


SECTION = "Driver scale"
GLANCE_CPU = "Driver CPU at 8,000 workers < 1 core"
GLANCE_CYCLE = "Driver discovery + planning cycle at 8,000 workers ≤ 0.1 s"
GLANCE_ROUND = "Rendezvous round of 1,024 workers ≤ 2 s"


def table(res: dict) -> str:
    ms = lambda s: f"{s * 1000:.1f} ms"  # noqa: E731
    lines = ["| measurement | result |", "|---|---|",
             "| rendezvous round (all arrive, the round forms, all collect their assignment, encoded and signed), "
             "driver CPU | " + ", ".join(f"{int(n):,}: {ms(t)}" for n, t in res["rounds"].items()) + " |"]
    if res.get("one_slot_rounds"):
        lines.append("| the same, one slot a host | " + ", ".join(
            f"{int(n):,} hosts: {ms(t)}" for n, t in res["one_slot_rounds"].items()) + " |")
    if res.get("reply_bytes"):
        lines.append("| the largest assignment sent (signed JSON), by workers and slots a host | " + ", ".join(
            f"{int(key.split('x')[0]):,} × {key.split('x')[1]}: {size:,} B" for key, size in res["reply_bytes"].items())
            + " |")
    for n, st in res["steady"].items():
        lines.append(f"| at {int(n):,} running workers: discovery + planning cycle, loop tick, first cycle (plans "
                     f"every launch) | {ms(st['cycle_s'])}, {ms(st['tick_s'])}, {ms(st['first_cycle_s'])} |")
    lines.append(f"| a heartbeat answered at once, through HTTP + HMAC | {res['heartbeat_http_cpu_s'] * 1e6:.0f} µs of "
                 f"driver CPU ({res['heartbeat_http_count']} messages) |")
    for n, live in res["live"].items():
        lines.append(f"| live driver, {int(n):,} workers long-polling | {live['cpu_s_per_s']:.2f} core: "
                     f"{live['polls_per_s']:.0f} heartbeats/s at {live['cpu_per_poll_s'] * 1e6:.0f} µs each, "
                     f"{live['system_share']:.0%} in the kernel; {live['failed_calls']} failed calls, "
                     f"{live['workers_lost']} workers lost |")
    at = res["at_8000"]
    lines.append(f"| driver CPU at 8,000 workers, estimated from the parts | {at['cores']:.2f} core: "
                 f"{at['heartbeats_per_s']:.0f} heartbeats/s × {at['heartbeat_cpu_s'] * 1e6:.0f} µs = "
                 f"{at['heartbeats']:.2f}, ticks {at['ticks']:.2f}, discovery {at['discovery']:.2f} |")
    return "\n".join(lines)


def glance(res: dict) -> list[list[str]]:
    at, rows = res["at_8000"], []
    live = res["live"].get(8000)
    measured = f"≈ {at['cores']:.2f} core estimated from its parts"
    if live:
        measured += f"; {live['cpu_s_per_s']:.2f} core measured at {live['polls_per_s']:.0f} heartbeats/s"
    rows.append([GLANCE_CPU, measured, f"{at['cores']:.2f}", where(SECTION),
                 docsection.verdict(at["cores"] < 1) + (", by estimate" if at["cores"] < 1 else "")])
    biggest = max(res["steady"], key=int)
    cycle = res["steady"][biggest]["cycle_s"]
    note = "" if int(biggest) >= 8000 else f" (at {int(biggest):,} workers: 8,000 not run)"
    rows.append([GLANCE_CYCLE, f"{cycle * 1000:.1f} ms{note}", f"{cycle / 0.1:.2f}", where(SECTION),
                 "not measured" if note else docsection.verdict(cycle <= 0.1)])
    if 1024 in res["rounds"]:
        r = res["rounds"][1024]
        rows.append([GLANCE_ROUND, f"{r * 1000:.0f} ms of driver CPU", f"{r / 2:.3f}", where(SECTION),
                     docsection.verdict(r <= 2)])
    return rows


if __name__ == "__main__":
    main()
