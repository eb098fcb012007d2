"""One process, no collectives: allreduce_bw.py's allocations per repetition, and the clone's page faults.

    python benchmarks/peers/clone_faults/pattern.py 4194304

Per repetition allreduce_bw.py clones (hvd.allreduce), frees the clone, then drops a
gradient and lets autograd allocate a new one (its DistributedOptimizer row). Prints the
minor page faults of each clone; run with and without MALLOC_TRIM_THRESHOLD_ /
MALLOC_MMAP_THRESHOLD_ to see glibc give the memory back and the clone fault it in again.
"""

import resource
import sys

import torch

n = int(sys.argv[1]) // 4
t, g = torch.ones(n), torch.ones(n)
p = torch.nn.Parameter(torch.zeros(n))
faults = []
for _ in range(20):
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    clone = t.detach().clone()
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
    del clone
    p.grad = None
    torch.autograd.backward(p, g)
print(sys.argv[1], "bytes: minor faults of each clone:", faults)
