"""Q6: per-rank bytes of params + grads + AdamW state held locally vs the full model."""
import torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from common import *

D, H, L = 1024, 1024, 3

def nbytes(t):
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()

def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    mesh = DeviceMesh.from_group(make_intra_group(rank), "cpu")
    cross = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)
    M = build_model(mesh, D, H, L); opt = torch.optim.AdamW(M.parameters(), lr=1e-3)
    x, y = batch(0, rank, D)
    F.mse_loss(M(x), y).backward(); cross_allreduce_grads(M, cross, N_HOSTS)
    full_p = sum(p.numel() * p.element_size() for p in M.parameters())   # global (DTensor) size
    pb = sum(nbytes(p) for p in M.parameters())
    gb = sum(nbytes(p.grad) for p in M.parameters())
    opt.step()
    ob = sum(nbytes(v) for st in opt.state.values() for v in st.values())
    # FSDP2's padded sharded storage actually allocated per param
    padded = sum(fp._sharded_param_data.numel() * 4 for m in fsdp_modules(M)
                 for g in m._get_fsdp_state()._fsdp_param_groups for fp in g.fsdp_params)
    full_total = full_p * 4   # params + grads + exp_avg + exp_avg_sq (step scalars ignored)
    tot = pb + gb + ob
    print(f"[rank {rank}] full model params {full_p/1e6:.3f} MB ({full_p//4} elems); local: params {pb/1e6:.3f} MB "
          f"(padded storage {padded/1e6:.3f} MB), grads {gb/1e6:.3f} MB, optim {ob/1e6:.3f} MB (incl step scalars); "
          f"local total {tot/1e6:.3f} MB vs full {full_total/1e6:.3f} MB -> ratio {tot/full_total:.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
