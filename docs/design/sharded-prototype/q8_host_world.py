"""Our architecture's shape: the DEFAULT process group is the host's own group (init_process_group over the host's
S slots only, on a host-keyed PrefixStore), FSDP2 shards over it with its default mesh; the cross-host group is a
standalone ProcessGroupGloo (never registered with torch.distributed, like cloud-elastic's RoundGroup) over the
same local rank of every host. Checks: trains, the replicas of shard i stay bitwise equal across hosts, and the
cross group can be replaced by a new standalone one (new prefix) without touching FSDP."""
import datetime, os, sys, torch, torch.nn as nn, torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

H, S = 2, 2

def worker(g, port):
    host, slot = divmod(g, S)
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, H * S, g == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"host{host}", store), rank=slot, world_size=S,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    def cross_group(gen):
        return dist.ProcessGroupGloo(dist.PrefixStore(f"cross{slot}/gen{gen}", store), host, H,
                                     datetime.timedelta(seconds=60))
    cross = cross_group(1)
    for step in range(8):
        if step == 4:
            cross = cross_group(2)  # re-formed: FSDP untouched
        gen = torch.Generator().manual_seed(step * 100 + g)
        x = torch.randn(16, 64, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        grads = [p.grad.to_local() for p in model.parameters()]
        flat = torch.cat([t.reshape(-1) for t in grads])
        cross.allreduce([flat]).wait()
        flat.div_(H)
        off = 0
        for t in grads:
            t.copy_(flat[off:off + t.numel()].view_as(t)); off += t.numel()
        opt.step(); opt.zero_grad()
    shards = torch.cat([p.to_local().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(shards) for _ in range(H)]
    cross.allgather([gathered], [shards]).wait()
    same = all(torch.equal(gathered[0], t) for t in gathered)
    print(f"[host {host} slot {slot}] default pg size {dist.get_world_size()} type(param)={type(next(model.parameters())).__name__} "
          f"shard numel {shards.numel()} loss {loss.item():.4f} replicas of my shard bitwise equal across hosts: {same}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(worker, args=(port,), nprocs=H * S)
