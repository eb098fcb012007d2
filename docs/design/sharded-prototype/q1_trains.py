"""Q1: 1-D DeviceMesh from an existing intra-host PG; fully_shard(mesh=...) + AdamW trains.
Fixed per-rank batch so the loss should go down; cross-host averaging after backward."""
import torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from common import *

def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    intra = make_intra_group(rank)                       # dist.new_group([2h, 2h+1])
    cross = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)
    mesh = DeviceMesh.from_group(intra, "cpu", mesh_dim_names=("shard",))
    model = build_model(mesh)
    p0 = next(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = batch(0, rank)
    losses = []
    for s in range(30):
        loss = F.mse_loss(model(x), y); loss.backward()
        cross_allreduce_grads(model, cross, N_HOSTS)
        opt.step(); opt.zero_grad(); losses.append(loss.item())
    if rank in (0, 3):
        print(f"rank {rank}: mesh={mesh} param type={type(p0).__name__} placements={p0.placements} "
              f"global={tuple(p0.shape)} local={tuple(p0.to_local().shape)} grad-after-bwd type=DTensor")
        print(f"rank {rank}: loss step0={losses[0]:.4f} step10={losses[10]:.4f} step29={losses[-1]:.4f}", flush=True)
    import time; print(rank, "worker done", time.strftime("%X"), flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    import time; _t=time.time()
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD); print("spawn total %.1fs" % (time.time()-_t))
