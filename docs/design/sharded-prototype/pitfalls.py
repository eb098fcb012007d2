"""(a) gloo allreduce AVG vs SUM-then-div for N=3 (non-power-of-2 hosts); (b) copy_ into p.to_local() without no_grad."""
import torch, torch.multiprocessing as mp, torch.distributed as dist
from common import free_port, init_world
def worker(rank, world, port):
    init_world(rank, world, port)
    g = torch.Generator().manual_seed(rank); x = torch.randn(100000, generator=g)
    a = x.clone(); dist.all_reduce(a, op=dist.ReduceOp.AVG)
    b = x.clone(); dist.all_reduce(b); b.div_(world)
    c = x.clone(); dist.all_reduce(c); c.mul_(1.0 / world)
    if rank == 0:
        print(f"N={world}: AVG vs SUM/N bitwise={torch.equal(a,b)} maxdiff={(a-b).abs().max().item():.3e}; "
              f"AVG vs SUM*(1/N) bitwise={torch.equal(a,c)} maxdiff={(a-c).abs().max().item():.3e}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    for n in (2, 3):
        mp.spawn(worker, args=(n, free_port()), nprocs=n)
