"""One training function, three ways to run it: ``cloud-elastic run``, Ray and Spark.

Under the launcher (hosts from -H or a cloud group)::

    cloud-elastic run -np 2 -H 127.0.0.1:2 python examples/elastic_anywhere.py --steps 50

On Ray, from Python (workers are Ray actors)::

    python examples/elastic_anywhere.py --ray auto --steps 50 --min-np 2 --max-np 4

On Spark (workers run beside Spark tasks)::

    python examples/elastic_anywhere.py --spark 'local[2]' --steps 50 --min-np 2 --max-np 4

``train()`` is the same function in every case and does not know where it runs.
It returns ``{"rank", "size", "step", "checksum"}``; equal checksums on every
rank mean the replicas are identical. ``--stop-file PATH`` keeps training past
``--steps`` until PATH exists (the tests use it to change membership mid-run);
the ranks decide together when to stop, so they all stop at the same step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time


def train(steps: int = 50, step_sleep: float = 0.0, stop_file: str | None = None, progress_dir: str | None = None) -> dict:
    """Train a small model elastically; see the module docstring."""
    import torch
    import torch.nn.functional as F

    import cloud_elastic.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    def report() -> None:
        # Progress for whoever watches the job (the tests): one small file per worker.
        if progress_dir:
            path = os.path.join(progress_dir, os.environ.get("CLOUD_ELASTIC_WORKER_ID", "worker").replace("/", "_"))
            with open(path + ".tmp", "w") as f:
                json.dump({"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "pid": os.getpid(),
                           "host": os.environ.get("CLOUD_ELASTIC_WORKER_ID", "").split("[")[0]}, f)
            os.replace(path + ".tmp", path)

    def finished() -> bool:
        if state.step < steps:
            return False
        if not stop_file:
            return True
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        return hvd.allreduce(flag, op=hvd.Sum).item() > 0  # every rank gets the same answer

    @hvd.elastic.run
    def loop(state: hvd.elastic.TorchState) -> None:
        while not finished():
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            report()
            if step_sleep:
                time.sleep(step_sleep)

    loop(state)
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().contiguous().numpy().tobytes())
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "checksum": h.hexdigest()[:16]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--stop-file")
    p.add_argument("--ray", metavar="ADDRESS", help="run on the Ray cluster at ADDRESS with ElasticRayExecutor")
    p.add_argument("--spark", metavar="MASTER", help="run on Spark (e.g. local[2] or yarn) with cloud_elastic.spark.run_elastic")
    p.add_argument("--min-np", type=int, default=1)
    p.add_argument("--max-np", type=int, default=2)
    args = p.parse_args()
    kwargs = dict(steps=args.steps, step_sleep=args.step_sleep, stop_file=args.stop_file)
    if args.ray:
        import ray

        from cloud_elastic.ray import ElasticRayExecutor

        ray.init(address=args.ray)
        executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=args.min_np, max_np=args.max_np))
        executor.start()
        results = executor.run(train, kwargs=kwargs)
    elif args.spark:
        from pyspark.sql import SparkSession

        from cloud_elastic.spark import run_elastic

        SparkSession.builder.master(args.spark).appName("elastic_anywhere").getOrCreate()
        results = run_elastic(train, kwargs=kwargs, num_proc=args.min_np, min_np=args.min_np, max_np=args.max_np)
    else:
        results = [train(**kwargs)]  # under cloud-elastic run: this process is one worker
    for result in results:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
