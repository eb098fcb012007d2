"""Q1+Q2: intra-host FSDP2 from an existing PG + manual cross-host allreduce of
local grad shards, compared with native HSDP (2-D mesh) on same data/seed."""
import sys, torch, torch.multiprocessing as mp, torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from common import *

STEPS = 6


def train(model, rank, step_fn_after_backward=None, steps=STEPS, log=False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for s in range(steps):
        x, y = batch(s, rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if step_fn_after_backward:
            step_fn_after_backward(model)
        opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return [p.to_local().detach().clone() for p in model.parameters()], losses, opt


def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    intra = make_intra_group(rank)
    cross = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)

    # ---- reference: native HSDP 2-D mesh ----
    mesh2 = init_device_mesh("cpu", (N_HOSTS, S), mesh_dim_names=("replicate", "shard"))
    ref = build_model(mesh2)
    ref_p, ref_l, _ = train(ref, rank)

    # ---- Q1: 1-D mesh built from the existing intra-host PG ----
    mesh1 = DeviceMesh.from_group(intra, "cpu", mesh_dim_names=("shard",))
    if rank == 0:
        print("mesh1:", mesh1, "ndim", mesh1.ndim, flush=True)

    # A: default divide (RS = AVG over S), then cross SUM / N after backward
    mA = build_model(mesh1)
    pA, lA, _ = train(mA, rank, lambda m: cross_allreduce_grads(m, cross, N_HOSTS))

    # B: set_gradient_divide_factor(S*N) -> RS PREMUL_SUM(1/(S*N)); cross SUM, no div
    mB = build_model(mesh1)
    for fm in fsdp_modules(mB):
        fm.set_gradient_divide_factor(float(S * N_HOSTS))
    try:
        pB, lB, _ = train(mB, rank, lambda m: cross_allreduce_grads(m, cross, 1))
        resB = f"maxdiff={max_diff(pB, ref_p):.3e} bitwise={bitwise(pB, ref_p)}"
    except Exception as e:
        resB = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    dist.barrier()

    # B2: force_sum_reduction + divide_factor(S*N) + hook doing cross SUM only:
    #     RS SUM -> hook cross SUM -> FSDP post-divides by S*N
    mB2 = build_model(mesh1)
    def sum_hook(out):
        cross.allreduce([out]).wait()
    for fm in fsdp_modules(mB2):
        fm.set_force_sum_reduction_for_comms(True)
        fm.set_gradient_divide_factor(float(S * N_HOSTS))
        fm.set_all_reduce_hook(sum_hook)
    pB2, _, _ = train(mB2, rank)
    resB2 = f"maxdiff={max_diff(pB2, ref_p):.3e} bitwise={bitwise(pB2, ref_p)}"

    # C: set_all_reduce_hook (runs on the flat reduce-scatter output per FSDP module)
    mC = build_model(mesh1)
    def hook(reduce_output):
        cross.allreduce([reduce_output]).wait()
        reduce_output.div_(N_HOSTS)
    for fm in fsdp_modules(mC):
        fm.set_all_reduce_hook(hook)
    pC, lC, _ = train(mC, rank)

    # D: no cross allreduce at all (sanity: should differ from HSDP)
    mD = build_model(mesh1)
    pD, lD, _ = train(mD, rank)

    for r in range(world):
        dist.barrier()
        if r == rank:
            print(f"[rank {rank} host {host} slot {slot}] local shard shapes "
                  f"{[tuple(p.shape) for p in pA]}", flush=True)
            print(f"  HSDP losses        {['%.4f' % l for l in ref_l]}")
            print(f"  A (manual) losses  {['%.4f' % l for l in lA]}")
            print(f"  A manual SUM/N after bwd : maxdiff={max_diff(pA, ref_p):.3e} bitwise={bitwise(pA, ref_p)}")
            print(f"  B divide_factor=S*N + SUM: {resB}")
            print(f"  B2 force_sum+factor S*N+SUM hook: {resB2}")
            print(f"  C set_all_reduce_hook    : maxdiff={max_diff(pC, ref_p):.3e} bitwise={bitwise(pC, ref_p)}")
            print(f"  D no cross allreduce     : maxdiff={max_diff(pD, ref_p):.3e} bitwise={bitwise(pD, ref_p)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
