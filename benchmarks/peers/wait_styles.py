"""Two plain Gloo processes (no launcher): whether ``Work.wait(timeout)`` leaves the work intact when it times out,
and what three ways of waiting cost per 1 KiB allreduce: ``work.wait()`` (raw), a done-callback and an Event
polled in 50 ms slices (as ``WorkerContext.wait``), and ``work.wait(timeout=50 ms)`` in a loop.

    flock /tmp/bench.lock python benchmarks/peers/wait_styles.py
"""
import os, sys, time, threading, statistics, datetime
import torch, torch.distributed as dist
def main(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    pg = dist.group.WORLD
    t = torch.ones(4)
    if rank == 1: time.sleep(0.3)
    w = dist.all_reduce(t, async_op=True)
    timeouts = 0
    while True:
        try:
            w.wait(timeout=datetime.timedelta(milliseconds=50)); break
        except RuntimeError as e:
            timeouts += 1; msg = str(e).splitlines()[0]
    if rank == 0: print("timed waits before done:", timeouts, "msg:", msg if timeouts else "-", "result ok:", t.tolist() == [2.0]*4, flush=True)
    x = torch.ones(256)
    def raw():
        dist.all_reduce(x, async_op=True).wait()
    def event():
        w = dist.all_reduce(x, async_op=True); fut = w.get_future()
        if not fut.done():
            ev = threading.Event(); fut.add_done_callback(lambda _f: ev.set())
            while not ev.wait(0.05): pass
        w.wait()
    def timed():
        w = dist.all_reduce(x, async_op=True)
        while True:
            try: w.wait(timeout=datetime.timedelta(milliseconds=50)); return
            except RuntimeError: pass
    res = {k: [] for k in ("raw", "event", "timed")}
    for i in range(300):
        for k, fn in (("raw", raw), ("event", event), ("timed", timed)):
            t0 = time.perf_counter(); fn(); res[k].append(time.perf_counter() - t0)
    if rank == 0:
        print({k: round(statistics.median(v[20:]) * 1e6) for k, v in res.items()}, "µs median, 1 KiB", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    if len(sys.argv) > 1: main(int(sys.argv[1]))
    else:
        import subprocess
        ps = [subprocess.Popen([sys.executable, __file__, str(r)], env=dict(os.environ, OMP_NUM_THREADS="1")) for r in (0, 1)]
        sys.exit(max(p.wait(timeout=300) for p in ps))
