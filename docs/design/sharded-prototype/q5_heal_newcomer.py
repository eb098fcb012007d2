"""Q5: heal a newcomer host. Host 1 is 'replaced' after step 2: its ranks drop model+optimizer,
build a fresh intra group (new_group(..., use_local_synchronization=True), members only) and a fresh
FSDP2 model with a different seed + empty AdamW state. A new cross group gen1 is formed; host 0
local rank i broadcasts shard i (params + exp_avg + exp_avg_sq + step) to the newcomer's local rank i.
Then training continues and must be bitwise equal to a reference run that never lost host 1."""
import torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from common import *

def step(model, opt, cross, s, rank):
    x, y = batch(s, rank)
    loss = F.mse_loss(model(x), y); loss.backward()
    cross_allreduce_grads(model, cross, N_HOSTS); opt.step(); opt.zero_grad()

def local_tensors(model, opt):
    out = [p.to_local() for p in model.parameters()]
    for p in model.parameters():
        st = opt.state[p]
        out += [st[k].to_local() if isinstance(st[k], DTensor) else st[k] for k in ("step", "exp_avg", "exp_avg_sq")]
    return out

def ensure_adamw_state(model, opt):
    # AdamW state is lazy; a newcomer creates same-layout state to receive into
    for p in model.parameters():
        if not opt.state[p]:
            opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": torch.zeros_like(p)}

@torch.no_grad()
def heal(model, opt, pg, src_index):
    ensure_adamw_state(model, opt)
    ts = local_tensors(model, opt)
    flat = torch.cat([t.reshape(-1).float() for t in ts])   # one message instead of many
    o = dist.BroadcastOptions(); o.rootRank = src_index
    pg.broadcast([flat], o).wait()
    off = 0
    for t in ts:
        n = t.numel(); t.copy_(flat[off:off + n].view_as(t)); off += n
    return flat.numel() * 4

def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    intra = make_intra_group(rank)
    mesh = DeviceMesh.from_group(intra, "cpu")
    permR = make_cross_group(f"cross/permR/slot{slot}", host, N_HOSTS)
    gen0 = make_cross_group(f"cross/gen0/slot{slot}", host, N_HOSTS)
    R = build_model(mesh); optR = torch.optim.AdamW(R.parameters(), lr=1e-2)
    M = build_model(mesh); optM = torch.optim.AdamW(M.parameters(), lr=1e-2)
    for s in range(3):
        step(M, optM, gen0, s, rank); step(R, optR, permR, s, rank)
    gen0.shutdown(); del gen0
    if host == 1:   # newcomer: fresh intra group, fresh model (different init), empty optimizer
        del M, optM
        intra_new = dist.new_group([2, 3], use_local_synchronization=True)
        mesh = DeviceMesh.from_group(intra_new, "cpu")
        M = build_model(mesh, seed=7); optM = torch.optim.AdamW(M.parameters(), lr=1e-2)
        before = bitwise(local_tensors(M, optM)[:6], local_tensors(R, optR)[:6]) if optM.state else False
    gen1 = make_cross_group(f"cross/gen1/slot{slot}", host, N_HOSTS)
    nbytes = heal(M, optM, gen1, src_index=0)
    # compare newcomer against its peer right after heal: fetch peer's shard over gen1
    mine = torch.cat([t.reshape(-1).float() for t in local_tensors(M, optM)])
    peer = mine.clone(); o = dist.BroadcastOptions(); o.rootRank = 0; gen1.broadcast([peer], o).wait()
    healed_eq = torch.equal(mine, peer)
    for s in range(3, 6):
        step(M, optM, gen1, s, rank); step(R, optR, permR, s, rank)
    mine = torch.cat([t.reshape(-1).float() for t in local_tensors(M, optM)])
    peer = mine.clone(); gen1.broadcast([peer], o).wait()
    eqR = bitwise(local_tensors(M, optM), local_tensors(R, optR))
    print(f"[rank {rank} host {host} slot {slot}] heal msg {nbytes} B; right after heal ==peer: {healed_eq}; "
          f"after 3 joint steps ==peer: {torch.equal(mine, peer)}; ==never-replaced reference: {eqR}", flush=True)
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
