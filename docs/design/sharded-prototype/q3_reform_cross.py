"""Q3: re-form the cross-host group between steps without touching the FSDP2 module.
Phase 0 (steps 0-2): 2 hosts, cross gen0 = dist.new_group([slot, S+slot], use_local_synchronization=True)
Phase 1 (steps 3-4): destroy it (dist.destroy_process_group(g)), re-create same membership as a
         standalone ProcessGroupGloo over PrefixStore("cross/gen1/slot{i}") -> must equal no-reform run.
Phase 2 (steps 5-7): host 1 leaves (its procs just exit, no collective). Host 0 shuts down gen1
         (pg.shutdown()) and forms gen2 of size 1 -> must equal FSDP-only (no cross) training.
The cross-host allreduce runs inside FSDP2's all-reduce hook, which reads the *current* group
from a holder, so the hook registration is never changed either."""
import gc, weakref, torch, torch.multiprocessing as mp, torch.distributed as dist, torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from common import *


def attach_hook(model, holder):
    def hook(out):
        pg, n = holder["pg"], holder["n"]
        if n > 1:
            pg.allreduce([out]).wait()
            out.div_(n)
    for fm in fsdp_modules(model):
        fm.set_all_reduce_hook(hook)


def step(model, opt, s, rank):
    x, y = batch(s, rank)
    loss = F.mse_loss(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
    return loss.item()


def worker(rank, world, port):
    init_world(rank, world, port)
    host, slot = host_slot(rank)
    intra = make_intra_group(rank)
    mesh = DeviceMesh.from_group(intra, "cpu")
    # every rank must call new_group for every group, even with use_local_synchronization
    g0 = None
    for i in range(S):
        g = dist.new_group([i, S + i], use_local_synchronization=True) if slot == i else None
        if slot == i:
            g0 = g
    holder = {"pg": g0, "n": N_HOSTS}

    model = build_model(mesh); attach_hook(model, holder)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # reference A: never re-forms (keeps gen0 the whole time for steps 0-4)
    permA = make_cross_group(f"cross/permA/slot{slot}", host, N_HOSTS)  # never destroyed
    refA = build_model(mesh); holderA = {"pg": permA, "n": N_HOSTS}; attach_hook(refA, holderA)
    optA = torch.optim.AdamW(refA.parameters(), lr=1e-2)
    # reference B: 2-host for steps 0-4, then plain FSDP (no cross) on host 0
    refB = build_model(mesh); holderB = {"pg": g0, "n": N_HOSTS}; attach_hook(refB, holderB)
    optB = torch.optim.AdamW(refB.parameters(), lr=1e-2)

    for s in range(3):
        step(model, opt, s, rank); step(refA, optA, s, rank); step(refB, optB, s, rank)

    # ---- phase 1: destroy + re-create same membership (standalone PG, new store prefix)
    dist.destroy_process_group(g0)
    holder["pg"] = make_cross_group(f"cross/gen1/slot{slot}", host, N_HOSTS)
    holderB["pg"] = holder["pg"]
    for s in range(3, 5):
        step(model, opt, s, rank); step(refA, optA, s, rank); step(refB, optB, s, rank)
    pm = [p.to_local() for p in model.parameters()]; pa = [p.to_local() for p in refA.parameters()]
    print(f"[rank {rank}] after re-form same membership: bitwise==no-reform run: {bitwise(pm, pa)}", flush=True)

    # ---- phase 2: host 1 leaves
    if host == 1:
        print(f"[rank {rank}] host 1 leaving (exit without any collective)", flush=True)
        import os; os._exit(0)
    old = holder["pg"]
    old.shutdown()
    wr = weakref.ref(old)
    holder["pg"] = holderB["pg"] = None
    del old; gc.collect()
    print(f"[rank {rank}] old cross PG still referenced after del+gc: {wr() is not None}", flush=True)
    holder["pg"] = make_cross_group(f"cross/gen2/slot{slot}", 0, 1); holder["n"] = 1
    holderB["n"] = 1  # reference: plain FSDP-only, no cross allreduce at all
    losses = []
    for s in range(5, 8):
        losses.append(step(model, opt, s, rank)); step(refB, optB, s, rank)
    pm = [p.to_local() for p in model.parameters()]; pb = [p.to_local() for p in refB.parameters()]
    print(f"[rank {rank}] host 0 alone (cross size 1) losses {['%.4f' % l for l in losses]}; "
          f"bitwise==FSDP-only reference: {bitwise(pm, pb)}", flush=True)
    # a size-1 standalone PG really does an allreduce:
    t = torch.ones(3); holder["pg"].allreduce([t]).wait()
    print(f"[rank {rank}] size-1 PG allreduce ok: {t.tolist()}", flush=True)
    os_exit = __import__("os")._exit
    os_exit(0)  # world is broken (host 1 gone): do not call destroy_process_group on the world


if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD)
