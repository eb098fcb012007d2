"""Q7: step time, our design (FSDP2 intra-host + cross-host allreduce of local grad shards) vs
native HSDP 2-D mesh, same 4 processes, alternating blocks, median of 20 steps each.
Per-step time = max over the 4 ranks (all_reduce MAX outside the timed region)."""
import time, statistics, torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from common import *

D, H, L, BS = 1024, 1024, 3, 64
ROUNDS, PER = 4, 5

def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    mesh1 = DeviceMesh.from_group(make_intra_group(rank), "cpu")
    cross = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)
    mesh2 = init_device_mesh("cpu", (N_HOSTS, S), mesh_dim_names=("replicate", "shard"))
    models = {}
    m = build_model(mesh1, D, H, L); models["ours_manual"] = (m, lambda mm: cross_allreduce_grads(mm, cross, N_HOSTS))
    m = build_model(mesh1, D, H, L)
    def hook(out):
        cross.allreduce([out]).wait(); out.div_(N_HOSTS)
    for fm in fsdp_modules(m): fm.set_all_reduce_hook(hook)
    models["ours_hook"] = (m, None)
    # async hook: launch the cross allreduce from the post-reduce-scatter hook and return at once
    # (gloo runs it on its own thread while backward continues); wait + divide before optimizer.step
    m = build_model(mesh1, D, H, L); pending = []
    def ahook(out):
        pending.append((cross.allreduce([out]), out))
    def finish(mm):
        for w, out in pending: w.wait(); out.div_(N_HOSTS)
        pending.clear()
    for fm in fsdp_modules(m): fm.set_all_reduce_hook(ahook)
    models["ours_async"] = (m, finish)
    models["hsdp"] = (build_model(mesh2, D, H, L), None)
    opts = {k: torch.optim.AdamW(v[0].parameters(), lr=1e-3) for k, v in models.items()}
    times = {k: [] for k in models}
    def one(k, s):
        m, post = models[k]; x, y = batch(s, rank, D, BS)
        dist.barrier(); t0 = time.perf_counter()
        F.mse_loss(m(x), y).backward()
        if post: post(m)
        opts[k].step(); opts[k].zero_grad()
        t = torch.tensor([time.perf_counter() - t0]); dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()
    for k in models:            # warmup
        for s in range(2): one(k, s)
    for r in range(ROUNDS):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for k in order:
            for s in range(PER): times[k].append(one(k, 100 + r * PER + s))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(f"{k:12s} median {med[k]*1e3:7.1f} ms  min {min(v)*1e3:7.1f}  max {max(v)*1e3:7.1f}  n={len(v)}")
        print(f"ratio ours_async/hsdp = {med['ours_async']/med['hsdp']:.3f}")
        print(f"ratio ours_manual/hsdp = {med['ours_manual']/med['hsdp']:.3f}; ours_hook/hsdp = {med['ours_hook']/med['hsdp']:.3f}", flush=True)
    ref = [p.to_local() for p in models["hsdp"][0].parameters()]
    eq = {k: bitwise([p.to_local() for p in models[k][0].parameters()], ref) for k in models}
    print(f"[rank {rank}] final local shards bitwise == hsdp after {2 + ROUNDS * PER} identical steps: {eq}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
