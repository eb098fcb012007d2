"""Q4: snapshot local shards (params + AdamW state), take a step, restore by copy_,
check bitwise equality with the snapshot and that training continues identically to a run
that never took the aborted step."""
import torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from common import *


def step(model, opt, cross, x, y):
    loss = F.mse_loss(model(x), y); loss.backward()
    cross_allreduce_grads(model, cross, N_HOSTS)
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def commit(model, opt):
    params = [p.to_local().clone() for p in model.parameters()]
    ostate = [{k: (v.to_local().clone() if isinstance(v, DTensor) else v.clone())
               for k, v in opt.state[p].items()} for p in model.parameters()]
    return params, ostate


@torch.no_grad()
def restore(model, opt, snap):
    params, ostate = snap
    for p, s in zip(model.parameters(), params):
        p.to_local().copy_(s)            # in place into FSDP2's sharded storage
    for p, st in zip(model.parameters(), ostate):
        for k, v in st.items():
            cur = opt.state[p][k]
            (cur.to_local() if isinstance(cur, DTensor) else cur).copy_(v)


def flat_state(model, opt):
    a, b = commit(model, opt)
    return a + [t for st in b for _, t in sorted(st.items())]


def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    intra = make_intra_group(rank)
    cross = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)
    mesh = DeviceMesh.from_group(intra, "cpu")
    M = build_model(mesh); optM = torch.optim.AdamW(M.parameters(), lr=1e-2)
    R = build_model(mesh); optR = torch.optim.AdamW(R.parameters(), lr=1e-2)
    for s in range(3):
        step(M, optM, cross, *batch(s, rank)); step(R, optR, cross, *batch(s, rank))
    p0 = next(M.parameters())
    if rank == 0:
        print("AdamW state per param:", {k: (type(v).__name__, tuple(v.shape),
              getattr(v, 'placements', None), tuple(v.to_local().shape) if isinstance(v, DTensor) else None)
              for k, v in optM.state[p0].items()}, flush=True)
    snap = commit(M, optM)
    step(M, optM, cross, *batch(99, rank))          # the step to be rolled back
    changed = not bitwise(flat_state(M, optM), snap[0] + [t for st in snap[1] for _, t in sorted(st.items())])
    restore(M, optM, snap)
    same = bitwise(flat_state(M, optM), snap[0] + [t for st in snap[1] for _, t in sorted(st.items())])
    for s in range(3, 6):
        lm = step(M, optM, cross, *batch(s, rank)); lr_ = step(R, optR, cross, *batch(s, rank))
    final = bitwise(flat_state(M, optM), flat_state(R, optR))
    print(f"[rank {rank}] aborted step changed state: {changed}; after restore bitwise==snapshot: {same}; "
          f"after 3 more steps bitwise==never-aborted run (params+exp_avg+exp_avg_sq+step): {final}; "
          f"last loss {lm:.6f} vs {lr_:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
