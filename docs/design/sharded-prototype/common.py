"""Shared helpers for the host-granularity FSDP2 prototype (CPU / gloo)."""
import os, socket, datetime, time
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard, FSDPModule
from torch.distributed.tensor import DTensor

N_HOSTS, S = 2, 2
WORLD = N_HOSTS * S


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def init_world(rank, world, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


def host_slot(rank):
    return rank // S, rank % S


def make_intra_group(rank):
    """All ranks must call: new_group is collective over the world."""
    mine = None
    for h in range(N_HOSTS):
        g = dist.new_group(list(range(h * S, (h + 1) * S)))
        if h == rank // S:
            mine = g
    return mine


def make_cross_group(store_prefix, my_index, size):
    """Standalone gloo PG over a PrefixStore of the default store; not registered
    with the world, so it can be destroyed/re-created by only its members."""
    store = dist.PrefixStore(store_prefix, dist.distributed_c10d._get_default_store())
    return dist.ProcessGroupGloo(store, my_index, size, datetime.timedelta(seconds=30))


class MLP(nn.Module):
    def __init__(self, d=128, h=256, L=3):
        super().__init__()
        dims = [d] + [h] * (L - 1) + [d]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def build_model(mesh, d=128, h=256, L=3, seed=0):
    torch.manual_seed(seed)
    m = MLP(d, h, L)
    for l in m.layers:
        fully_shard(l, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def batch(step, rank, d=128, bs=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(bs, d, generator=g), torch.randn(bs, d, generator=g)


def fsdp_modules(m):
    return [x for x in m.modules() if isinstance(x, FSDPModule)]


def cross_allreduce_grads(model, cross_pg, n_hosts):
    """Manual cross-host allreduce of local grad shards, after backward, before step."""
    locs = [p.grad.to_local() for p in model.parameters() if p.grad is not None]
    flat = torch.cat([t.reshape(-1) for t in locs])
    if n_hosts > 1:
        cross_pg.allreduce([flat], dist.AllreduceOptions()).wait()  # SUM
        flat.div_(n_hosts)
    off = 0
    for t in locs:
        n = t.numel(); t.copy_(flat[off:off + n].view_as(t)); off += n


def local_state(model, opt):
    """Snapshot of local shards (params + optimizer state) as plain tensors."""
    ps = [p.to_local().detach().clone() for p in model.parameters()]
    os_ = []
    for p in model.parameters():
        st = opt.state.get(p, {})
        os_.append({k: (v.to_local().clone() if isinstance(v, DTensor) else v.clone())
                    for k, v in st.items()})
    return ps, os_


def max_diff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def bitwise(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))
