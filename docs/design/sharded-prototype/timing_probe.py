import time; T0=time.time()
import torch, torch.multiprocessing as mp, torch.distributed as dist
from common import *
def worker(rank, world, port):
    t=time.time(); print(rank,"start",round(t-T0,1),flush=True)
    init_world(rank, world, port); print(rank,"init",round(time.time()-t,1),flush=True)
    intra = make_intra_group(rank); print(rank,"intra",round(time.time()-t,1),flush=True)
    cross = make_cross_group(f"c/{rank%S}", rank//S, N_HOSTS); print(rank,"cross",round(time.time()-t,1),flush=True)
    dist.barrier(); print(rank,"barrier",round(time.time()-t,1),flush=True)
    dist.destroy_process_group(); print(rank,"destroyed",round(time.time()-t,1),flush=True)
if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD, free_port()), nprocs=WORLD); print("end", round(time.time()-T0,1))
