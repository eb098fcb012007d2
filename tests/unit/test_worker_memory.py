"""worker/memory.py: the tensors a training step allocates anew reuse freed memory without page faults."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from cloud_elastic.worker.memory import collector_paused
from cloud_elastic.worker.settings import WorkerSettings


pytestmark = pytest.mark.timeout(120)  # two interpreters importing torch, on a loaded machine

# Like a step's gradients: twelve 8 MiB blocks allocated, written, then all freed. They are
# taken from libc directly (torch's CPU allocator is libc's malloc too), so that nothing
# Python allocates lies above them at the top of the heap and the outcome does not depend
# on layout luck. glibc's dynamic trim threshold is at most 64 MiB (twice its largest mmap
# threshold), so with its defaults the 96 MiB freed at the top is always handed back and
# faulted in again; with the fixed thresholds (blocks under 32 MiB come from the heap,
# 1 GiB may stay free) it is kept.
_STEPS = r"""
import ctypes, json, os, resource
import torch  # imported as in a worker: its start-up allocations shape glibc's thresholds
from cloud_elastic.worker.memory import keep_freed_memory
from cloud_elastic.worker.settings import WorkerSettings
tuned = keep_freed_memory(WorkerSettings.from_environ().malloc_tuning)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 8 * 1024 * 1024
def step():
    blocks = [libc.malloc(SIZE) for _ in range(12)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)
    for b in blocks:
        libc.free(b)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # untuned, each step faults 96 MiB in again: 5 show it as well as 20, at a quarter of the CPU
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
print(json.dumps({"tuned": tuned, "faults_per_step": faults}))
"""


def _start(**env: str) -> subprocess.Popen:
    base = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", _STEPS], env={**base, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_freed_step_memory_is_reused_without_page_faults():
    # Both interpreters at once (each counts only its own faults): most of their time is importing torch.
    tuned_proc, untuned_proc = _start(), _start(CLOUD_ELASTIC_MALLOC_TUNING="0")
    try:
        tuned, untuned = _result(tuned_proc), _result(untuned_proc)
    finally:
        untuned_proc.kill()
    assert tuned["tuned"] is True
    assert tuned["faults_per_step"] < 10
    # The same steps with glibc's defaults fault the pages back in (96 MiB = 24,576 pages).
    assert untuned["tuned"] is False
    assert untuned["faults_per_step"] > 1000


@pytest.mark.parametrize("name", ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_users_own_allocator_settings_win(name):
    # In this process: the worker reads its settings once and hands malloc_tuning to keep_freed_memory
    # (the subprocess above shows that path end to end with CLOUD_ELASTIC_MALLOC_TUNING=0).
    settings = WorkerSettings.from_environ({name: "1"})
    assert settings.malloc_tuning is False
    assert WorkerSettings.from_environ({}).malloc_tuning is True


def test_the_collector_runs_no_pass_in_a_paused_block_and_is_then_as_it_was():
    """A worker's preload (``hvd.init()``'s ``torch._dynamo``; the fork server's whole preload) runs in such a block:
    no collector pass goes over torch's objects while the import allocates, and the script's collector is on after."""
    passes: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with collector_paused():
            made = [[i] for i in range(100_000)]  # a hundred times the youngest generation's threshold
            paused_inside, passes_inside = not gc.isenabled(), list(passes)
        after = gc.isenabled()
        del made
        gc.disable()
        with collector_paused():
            pass
        kept_off = not gc.isenabled()
    finally:
        gc.enable()
        gc.callbacks.remove(count)
    assert paused_inside and passes_inside == [] and after
    assert kept_off  # a caller that had it off (the fork server around its whole preload) keeps it off
