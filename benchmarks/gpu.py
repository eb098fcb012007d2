"""One GPU, a 12-layer transformer (151 M parameters outside its embeddings): step time and peak memory vs DDP.

    python benchmarks/gpu.py [--quick] [--out-md PATH] [--update-docs]

Five variants of the same training step (forward, cross-entropy, backward, AdamW
step with torch's defaults, TF32 on), each in a process of its own, launched as a
user would launch it:

=========  ===========================================================================
plain      ``python benchmarks/gpu.py --worker plain``: no torch.distributed at all
ddp        ``python benchmarks/gpu.py --worker ddp``: ``DistributedDataParallel`` on NCCL,
           world size 1, ``init_process_group`` with a file store
every1     ``cloud-elastic run -np 1 -H 127.0.0.1:1 python benchmarks/gpu.py --worker elastic``
           (NCCL, ``DistributedOptimizer``, ``TorchState``): a commit every step
every10    the same, a commit every 10 steps
snapshot   a commit every step with ``CLOUD_ELASTIC_COMMIT_MODE=snapshot`` (every commit
           keeps a copy of the parameters and optimizer state, as a loop with a
           collective between ``step()`` and ``commit()`` gets)
=========  ===========================================================================

Each worker times every step with ``torch.cuda.synchronize()`` at its end, drops
the warm-up steps, and reports its step times and ``torch.cuda.max_memory_allocated``
(the whole run). The variants run one after another (they would compete for the
GPU side by side); the full run does two rounds, the second in reverse order, and
pools the steps of both. Reported: median and p90 step time, peak memory, and each
as a ratio to DDP's. ``--quick`` (one round, 30 timed steps each) takes about a
minute on an H100; the full run (two rounds, 150 timed steps each) a few minutes.

Output: the Markdown table "GPU benchmark (<device>, torch <version>, NCCL <version>)",
always printed; written to ``--out-md`` when given, and with ``--update-docs`` into
docs/benchmarks.md between ``<!-- gpu:begin -->`` and ``<!-- gpu:end -->`` (its "GPU" section, the
one ``./dev bench`` writes; the table's title names the GPU)
(``benchmarks/docsection.py``). Without CUDA it prints one line and exits 0, so a
benchmark suite can run it anywhere. ``--device cpu`` (not for measuring) runs a
tiny model through the same machinery on the CPU, over Gloo, to check the script.

``--profile N`` (one round; nothing written to the docs) also records N steps of each
variant after its warm-up with ``torch.profiler`` and prints, per step, the host's waits
on the device (``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaDeviceSynchronize``,
a device-to-host ``cudaMemcpy``, ``aten::_local_scalar_dense`` from ``.item()``) and the
operators with the most host time: where a variant's step time above DDP's goes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The section of docs/benchmarks.md (benchmarks/docsection.py) this table goes into; run_all.py uses the same.
SECTION_KEY, SECTION = "gpu", "GPU"
RESULT = re.compile(r"GPUBENCH (\{.*\})\s*$")
ELASTIC = [sys.executable, "-m", "cloud_elastic.cli", "run", "-np", "1", "-H", "127.0.0.1:1"]
#: name -> (label in the table, the worker's own arguments, extra environment, under cloud-elastic run)
VARIANTS: dict[str, tuple[str, list[str], dict[str, str], bool]] = {
    "plain": ("plain torch", ["--worker", "plain"], {}, False),
    "ddp": ("DDP (NCCL, world size 1)", ["--worker", "ddp"], {}, False),
    "every1": ("cloud-elastic, commit every step", ["--worker", "elastic", "--commit-every", "1"], {}, True),
    "every10": ("cloud-elastic, commit every 10 steps", ["--worker", "elastic", "--commit-every", "10"], {}, True),
    "snapshot": ("cloud-elastic, commit every step, `CLOUD_ELASTIC_COMMIT_MODE=snapshot`",
                 ["--worker", "elastic", "--commit-every", "1"], {"CLOUD_ELASTIC_COMMIT_MODE": "snapshot"}, True),
    # Diagnostics, run only when --only names them: DistributedOptimizer and the worker's threads, no commit;
    # and a cloud-elastic worker (init(): its threads, its environment) running plain torch's step.
    "nocommit": ("cloud-elastic, no commit in the timed steps", ["--worker", "elastic", "--commit-every", "0"], {}, True),
    "initonly": ("plain torch in a cloud-elastic worker (`init()` only)", ["--worker", "init"], {}, True),
}
#: What a run measures unless --only says otherwise.
DEFAULT_VARIANTS = ("plain", "ddp", "every1", "every10", "snapshot")


@dataclass(frozen=True)
class ModelConfig:
    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int
    seq: int
    batch: int


GPU_MODEL = ModelConfig(layers=12, d_model=1024, heads=16, d_ff=4096, vocab=32000, seq=512, batch=8)
#: --device cpu: the same machinery on a model small enough for a laptop's CPU.
CPU_MODEL = ModelConfig(layers=2, d_model=64, heads=4, d_ff=256, vocab=512, seq=32, batch=2)


# ------------------------------------------------------------------------------------------- the worker
def build_model(cfg: ModelConfig):
    """A GPT-style decoder: token and position embeddings, pre-norm blocks, a head tied to the token embedding."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
            self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
            self.proj = nn.Linear(cfg.d_model, cfg.d_model)
            self.fc1, self.fc2 = nn.Linear(cfg.d_model, cfg.d_ff), nn.Linear(cfg.d_ff, cfg.d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, cfg.heads, d // cfg.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.seq, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln = nn.LayerNorm(cfg.d_model)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.tok.weight.t()  # logits; the head shares the token embedding

    return GPT()


def enable_tf32() -> None:
    import torch

    try:  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    except AttributeError:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def nccl_version() -> str:
    import torch

    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return "n/a"
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


#: Host-side events that make the host wait for the device (counted per profiled step).
HOST_WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
              "aten::_local_scalar_dense")


class StepProfile:
    """``torch.profiler`` over ``steps`` steps after ``start`` (none when ``steps`` is 0); see ``--profile``."""

    def __init__(self, start: int, steps: int, cuda: bool, trace: str = "") -> None:
        self.start, self.steps, self.cuda, self.trace = start, steps, cuda, trace
        self._prof = None
        self.result: dict | None = None

    def before_step(self, index: int) -> None:
        if self.steps and index == self.start:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities)
            self._prof.start()

    def after_step(self, index: int) -> None:
        if self._prof is None or index != self.start + self.steps - 1:
            return
        self._prof.stop()
        if self.trace:  # the whole timeline, gzipped, for chrome://tracing or Perfetto
            import gzip
            import shutil

            self._prof.export_chrome_trace(self.trace)
            with open(self.trace, "rb") as raw, gzip.open(self.trace + ".gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            os.unlink(self.trace)
        events = self._prof.key_averages()
        waits = {name: 0.0 for name in HOST_WAITS}
        for e in events:
            for name in HOST_WAITS:
                if e.key.startswith(name):
                    waits[name] += e.count / self.steps
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]

        def device_us(e) -> float:  # torch >= 2.4 names it device time; older ones cuda time
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) or 0)

        from torch.autograd import DeviceType

        kernels = [e for e in events if e.device_type == DeviceType.CUDA]  # kernels, copies, NCCL's kernels
        busy = sorted(kernels, key=device_us, reverse=True)[:10]
        self.result = {
            "steps": self.steps,
            "host_waits_per_step": {k: round(v, 2) for k, v in waits.items() if v},
            "top_host_ms_per_step": [(e.key, round(e.self_cpu_time_total / 1e3 / self.steps, 3)) for e in top],
            # The device's own time per step (its kernels, copies and collectives, none counted twice):
            # against the step's wall time, what is left is the GPU idle, waiting for the host.
            "device_ms_per_step": round(sum(device_us(e) for e in kernels) / 1e3 / self.steps, 3),
            "top_device_ms_per_step": [(e.key, round(device_us(e) / 1e3 / self.steps, 3)) for e in busy if device_us(e)],
        }
        self._prof = None


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    cuda = args.device == "cuda"
    cfg = GPU_MODEL if cuda else CPU_MODEL
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        enable_tf32()
    torch.manual_seed(0)
    with device:  # parameters initialised where they live
        model = build_model(cfg)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    total = args.warmup + args.steps
    times: list[float] = []
    trace = str(Path(args.trace_dir) / f"trace-{args.variant}.json") if args.trace_dir and args.variant else ""
    profile = StepProfile(args.warmup, min(args.profile, args.steps), cuda, trace)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def loss_of(net: torch.nn.Module) -> torch.Tensor:
        return F.cross_entropy(net(inputs).reshape(-1, cfg.vocab), targets.reshape(-1))

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    if args.worker in ("plain", "ddp", "init"):
        net, store = model, None
        if args.worker == "ddp":
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            store = tempfile.mkdtemp(prefix="gpu-bench-")
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}/store", rank=0,
                                    world_size=1, **({"device_id": device} if cuda else {}))
            net = DistributedDataParallel(model, device_ids=[0] if cuda else None)
        opt = adamw(net.parameters())

        def plain_steps(_state=None) -> None:
            for index in range(total):
                profile.before_step(index)
                began = time.perf_counter()
                opt.zero_grad()
                loss_of(net).backward()
                opt.step()
                sync()
                times.append(time.perf_counter() - began)
                profile.after_step(index)

        if args.worker == "init":  # torch's own step, in a cloud-elastic worker's process
            import cloud_elastic.torch as hvd

            hvd.init()
            hvd.elastic.run(plain_steps)(hvd.elastic.ObjectState(step=0))
        else:
            plain_steps()
        if args.worker == "ddp":
            import torch.distributed as dist

            dist.destroy_process_group()
    else:
        import cloud_elastic.torch as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(adamw(model.parameters()))
        state = hvd.elastic.TorchState(model, opt, step=0)

        @hvd.elastic.run
        def train(state) -> None:
            while state.step < total:
                index = state.step
                profile.before_step(index)
                began = time.perf_counter()
                opt.zero_grad()
                loss_of(model).backward()
                opt.step()
                state.step += 1
                if args.commit_every and state.step % args.commit_every == 0:
                    state.commit()
                sync()
                times.append(time.perf_counter() - began)
                profile.after_step(index)

        train(state)
        if hvd.rank() != 0:
            return
    params = sum(p.numel() for p in model.parameters())
    embedding = model.tok.weight.numel() + model.pos.weight.numel()
    print("GPUBENCH " + json.dumps({
        "worker": args.worker, "times": times[args.warmup:], "warmup": args.warmup,
        "peak": torch.cuda.max_memory_allocated(device) if cuda else None,
        "params": params, "non_embedding": params - embedding, "model": asdict(cfg),
        "device": torch.cuda.get_device_name(device) if cuda else "CPU", "torch": torch.__version__,
        "nccl": nccl_version() if cuda else "n/a", "profile": profile.result,
    }), flush=True)


# ------------------------------------------------------------------------------------- the orchestrator
def measure(name: str, args: argparse.Namespace) -> dict:
    """Run one variant as a user would; return its worker's report."""
    label, worker_args, extra_env, elastic = VARIANTS[name]
    worker = [sys.executable, str(Path(__file__).resolve()), *worker_args, "--device", args.device,
              "--warmup", str(args.warmup), "--steps", str(args.steps), "--profile", str(args.profile),
              "--variant", name] + (["--trace-dir", str(Path(args.trace_dir).resolve())] if args.trace_dir else [])
    cmd = ELASTIC + worker if elastic else worker
    path = os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYTHONPATH": path, **extra_env}
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.variant_timeout)
    found = [m for line in proc.stdout.splitlines() for m in [RESULT.search(line)] if m]
    if proc.returncode != 0 or not found:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise SystemExit(f"benchmarks/gpu.py: the {name} variant failed (exit {proc.returncode}):\n{tail}")
    report = json.loads(found[-1].group(1))
    report["wall_s"] = time.monotonic() - began
    return report


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(reports: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for name, runs in reports.items():
        times = [t for r in runs for t in r["times"]]
        peaks = [r["peak"] for r in runs if r["peak"] is not None]
        out[name] = {"median": statistics.median(times), "p90": percentile(times, 0.9), "steps": len(times),
                     "peak": max(peaks) if peaks else None}
    return out


def table(reports: dict[str, list[dict]], args: argparse.Namespace, rounds: int) -> str:
    first = next(iter(reports.values()))[0]
    cfg = ModelConfig(**first["model"])
    stats = summarize(reports)
    ddp = stats["ddp"]
    title = f"GPU benchmark ({first['device']}, torch {first['torch']}, NCCL {first['nccl']})"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/gpu.py" + (" --quick" if args.quick else "") + (" --device cpu" if args.device == "cpu" else "")
    gpu = first["device"] != "CPU"
    lines = [
        f"### {title}", "",
        f"Measured {when} with `{command}`{'' if gpu else ' (a check of the script on the CPU, not a measurement)'}. "
        f"Model: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, "
        f"feed-forward {cfg.d_ff}, vocabulary {cfg.vocab} (head tied to the embedding), sequence {cfg.seq}, batch "
        f"{cfg.batch}: {first['params'] / 1e6:.1f} M parameters ({first['non_embedding'] / 1e6:.1f} M outside the "
        f"embeddings); AdamW (torch's defaults){', TF32 on' if gpu else ''}. Each variant ran in its own process, "
        f"{rounds} round(s) ({'alternating order, ' if rounds > 1 else ''}{first['warmup']} warm-up steps dropped "
        f"per run); {stats['ddp']['steps']} timed steps per variant"
        + (", each ended by `torch.cuda.synchronize()`. Peak memory is `torch.cuda.max_memory_allocated()` over "
           "the whole run." if gpu else "."), "",
        "| variant | median step | p90 step | median / DDP | peak GPU memory | peak / DDP |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in stats.items():
        peak = f"{s['peak'] / 2**30:.2f} GiB" if s["peak"] is not None else "n/a"
        peak_ratio = f"{s['peak'] / ddp['peak']:.3f}×" if s["peak"] is not None and ddp["peak"] else "n/a"
        label = VARIANTS[name][0] if gpu else VARIANTS[name][0].replace("NCCL", "Gloo")
        lines.append(f"| {label} | {s['median'] * 1e3:.1f} ms | {s['p90'] * 1e3:.1f} ms | "
                     f"{s['median'] / ddp['median']:.3f}× | {peak} | {peak_ratio} |")
    return "\n".join(lines)


def profile_report(reports: dict[str, list[dict]]) -> str:
    """What ``--profile`` found, per variant: the host's waits on the device and its busiest operators."""
    lines = ["", "Profile (per step, host side):"]
    for name, runs in reports.items():
        prof = runs[0].get("profile")
        if not prof:
            continue
        waits = ", ".join(f"{k} {v:g}" for k, v in prof["host_waits_per_step"].items()) or "none"
        lines.append(f"- {name}: waits on the device: {waits}")
        lines.append("  busiest: " + "; ".join(f"{k} {ms:.2f} ms" for k, ms in prof["top_host_ms_per_step"][:8]))
        if prof.get("device_ms_per_step"):
            wall = statistics.median(runs[0]["times"][: prof["steps"]]) * 1e3  # the profiled steps come first
            lines.append(f"  device busy {prof['device_ms_per_step']:.2f} ms of a {wall:.2f} ms step; busiest there: "
                         + "; ".join(f"{k[:60]} {ms:.2f} ms" for k, ms in prof["top_device_ms_per_step"][:8]))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one round, 30 timed steps per variant (about a minute)")
    p.add_argument("--out-md", default="", help="also write the table to this file")
    p.add_argument("--update-docs", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--only", default="", help="comma-separated variants (ddp always runs: the ratios need it)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="one round; also profile N steps of each variant and print the host's waits on the device")
    p.add_argument("--trace-dir", default="", help="with --profile: also write each variant's profiled steps there, "
                   "as a gzipped Chrome trace (trace-<variant>.json.gz)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=("plain", "ddp", "elastic", "init"), help=argparse.SUPPRESS)
    p.add_argument("--commit-every", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--variant-timeout", type=float, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.warmup < 0 or args.steps < 0:
        args.warmup, args.steps = (2, 5) if args.device == "cpu" else (10, 30) if args.quick else (20, 150)
    if args.worker:
        run_worker(args)
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured")
        return
    if args.update_docs and args.device == "cpu":
        p.error("--update-docs records GPU figures; not with --device cpu")
    names = list(DEFAULT_VARIANTS) if not args.only else [n for n in VARIANTS if n in args.only.split(",") or n == "ddp"]
    if args.profile and args.update_docs:
        p.error("--profile slows the profiled steps; its figures do not go into the docs")
    rounds = 1 if args.quick or args.device == "cpu" or args.profile else 2
    args.variant_timeout = args.variant_timeout or (240 if args.quick else 480)
    reports: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            report = measure(name, args)
            reports[name].append(report)
            peak = f", peak {report['peak'] / 2**30:.2f} GiB" if report["peak"] is not None else ""
            # Each run's figures as it ends: a benchmark cut by its time budget still leaves them in the log.
            print(f"[gpu-bench] round {r + 1}/{rounds} {name}: median {statistics.median(report['times']) * 1e3:.1f} ms"
                  f"{peak} over {len(report['times'])} steps, {report['wall_s']:.0f} s in all", file=sys.stderr, flush=True)
    text = table(reports, args, rounds)
    print(text)
    if args.profile:
        print(profile_report(reports))
    if args.out_md:
        Path(args.out_md).write_text(text + "\n")
    if args.update_docs:
        record(text)


def record(text: str, doc: Path | None = None) -> None:
    """Put ``text`` (the table) into the GPU section of docs/benchmarks.md, or of ``doc``."""
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)  # for docsection only: left there, benchmarks/kubernetes.py would pass for the package
    try:
        import docsection
    finally:
        sys.path.remove(here)
    docsection.write_section(SECTION_KEY, SECTION, text, doc or docsection.DOC)


if __name__ == "__main__":
    main()
