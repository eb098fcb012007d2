"""worker/link/progress.py and worker/selftest.py: what a worker tells the driver about its own health."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
import torch

from cloud_elastic.worker.link.progress import RECENT_STEPS, Progress, format_stacks
from cloud_elastic.worker.selftest import check_device, device_for_slot

pytestmark = pytest.mark.timeout(30)


def test_compute_time_is_the_time_between_steps_less_the_waits_on_peers():
    p = Progress()
    now = 100.0
    p.step(now)  # the round's first step starts the clock
    for _ in range(5):
        with p.waiting():
            time.sleep(0.02)  # a collective
        now += 0.5
        p.step(now)
    compute = p.compute_s()
    assert compute is not None and 0.4 < compute < 0.49


def test_compute_time_needs_three_steps_of_the_round_and_starts_over_with_a_new_round():
    p = Progress()
    for t in (1.0, 2.0, 3.0):
        p.step(t)
    assert p.compute_s() is None  # two intervals only
    p.step(4.0)
    assert p.compute_s() == 1.0
    p.new_round()
    p.step(10.0)
    assert p.compute_s() is None
    for i in range(1, RECENT_STEPS + 5):
        p.step(10.0 + 0.1 * i)
    assert abs(p.compute_s() - 0.1) < 1e-9


def test_a_thread_running_python_is_progress_and_one_blocked_in_native_code_is_not():
    p = Progress()
    release = threading.Event()
    started = threading.Event()

    def blocked() -> None:
        p.watch_thread()
        started.set()
        release.wait()  # a lock wait: no Python runs

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    started.wait(5)
    time.sleep(0.05)
    first = p.sample()
    assert p.sample() == first and p.sample() == first
    release.set()
    t.join(5)

    def busy() -> None:
        p.watch_thread()
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            sum(range(100))

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    counts = []
    for _ in range(5):
        time.sleep(0.05)
        counts.append(p.sample())
    t.join(5)
    assert counts[-1] > counts[0]


def test_waiting_in_a_collective_is_not_progress():
    p = Progress()
    p.watch_thread()
    with p.waiting():
        before = p.sample()
        sum(range(1000))
        assert p.sample() == before
        assert p.waiting_s() >= 0.0


def test_stacks_name_every_thread():
    text = format_stacks()
    assert "test_stacks_name_every_thread" in text and "thread 0x" in text.lower()


def test_with_more_threads_than_shown_the_training_thread_is_still_in_the_stacks_and_last():
    """A worker with a pool of 150 threads: the stuck round's report still names where the main thread is
    (the last block, which the report's size cap keeps), and says how many threads it left out."""
    release = threading.Event()
    pool = [threading.Thread(target=release.wait, daemon=True) for _ in range(150)]
    for thread in pool:
        thread.start()
    try:
        text = format_stacks()
    finally:
        release.set()
        for thread in pool:
            thread.join(5)
    blocks = text.strip().split("\n\n")
    assert len(blocks) == 101 and re.fullmatch(r"\.\.\. \d+ more thread\(s\) not shown", blocks[0]), blocks[0]
    assert "in test_with_more_threads_than_shown_the_training_thread_is_still_in_the_stacks_and_last" in blocks[-1]
    assert all(len(block.splitlines()) <= 102 for block in blocks)


def test_a_working_device_passes_its_self_test_and_a_stuck_one_fails_with_one_line(monkeypatch):
    assert check_device(torch.device("cpu")) is None
    # A device that never answers (the check blocks until the test lets it go): a reason at the timeout.
    from cloud_elastic.worker import selftest

    wedged = threading.Event()
    monkeypatch.setattr(selftest, "_check", lambda device: wedged.wait(30) and None)
    started = time.monotonic()
    try:
        reason = check_device(torch.device("cpu"), timeout_s=0.2)
    finally:
        wedged.set()
    assert reason == "the device self-test on cpu did not finish within 0.2s"
    assert time.monotonic() - started < 5.0
    # A check that ends, but later than the bound, failed it too (whichever thread ran first).
    wedged.clear()
    monkeypatch.setattr(selftest, "_check", lambda device: None)
    for _ in range(20):
        assert check_device(torch.device("cpu"), timeout_s=1e-9) == "the device self-test on cpu did not finish within 1e-09s"


def test_with_nccl_a_worker_tests_its_own_gpu_and_the_slot_must_have_one():
    assert device_for_slot("nccl", 3) == torch.device("cuda", 3)
    if not torch.cuda.is_available():
        assert device_for_slot("gloo", 3) == torch.device("cpu")


def test_the_hang_line_names_the_training_threads_innermost_frame_however_deep_it_is():
    """The driver's ``main_frame`` reads the block the worker marked as its main thread's: 150 frames deep and
    blocked in native code, its ``<module>`` frame is beyond the 100 shown; a thread that is itself importing a
    module is not it. The stacks are taken from another thread, as the worker's driver link does."""
    from cloud_elastic.driver.job.stalls import main_frame

    read_end, write_end = os.pipe()
    taken: list[str] = []

    def take() -> None:
        time.sleep(0.2)
        taken.append(format_stacks())
        os.write(write_end, b"x")

    def deep(n: int) -> bytes:
        return deep(n - 1) if n else os.read(read_end, 1)  # blocked in C: deep is the innermost Python frame

    importing, release = threading.Event(), threading.Event()
    # Older threads beyond the 100 shown (a long-lived pool), so the newest, the importing one, must still be shown.
    pool = [threading.Thread(target=release.wait, args=(10,), daemon=True) for _ in range(120)]
    for thread in pool:
        thread.start()
    lazy = compile("importing.set(); release.wait(10)", "lazy_mod.py", "exec")
    other = threading.Thread(target=exec, args=(lazy, {"importing": importing, "release": release}), daemon=True)
    other.start()
    importing.wait(5)
    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    try:
        deep(150)
    finally:
        release.set()
        other.join(5)
        taker.join(5)
        for thread in pool:
            thread.join(5)
        os.close(read_end)
        os.close(write_end)
    text = taken[0]
    assert "lazy_mod.py" in text and "in <module>" in text  # the other thread runs a <module> frame
    assert main_frame(text).startswith('"' + __file__) and main_frame(text).endswith(" in deep"), main_frame(text)
