"""driver/runtime/signal_stacks.py: a signalled worker's faulthandler lines are told apart from its other output."""

from __future__ import annotations

import subprocess
import sys

from cloud_elastic.driver.runtime.signal_stacks import MAX_TEXT, SignalStacks

_DUMP = """
import faulthandler, sys, threading, time
def waiting_in_a_thread():
    time.sleep(30)
threading.Thread(target=waiting_in_a_thread, daemon=True).start()
time.sleep(0.2)
print("loss 0.25 at step 5", flush=True)
def one_step():
    faulthandler.dump_traceback(all_threads=True)
one_step()
print("loss 0.24 at step 6", flush=True)
"""


def _real_dump() -> list[str]:
    out = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()[:1] + out.stderr.splitlines() + out.stdout.splitlines()[1:]


def test_only_the_stack_lines_printed_after_the_signal_are_kept_for_the_signalled_worker():
    lines = _real_dump()
    stacks = SignalStacks()
    stacks.offer("w1", lines[1])  # before the signal: not gathered
    stacks.expect("w1")
    for line in lines:
        stacks.offer("w1", line)
        stacks.offer("w2", line)  # a worker nobody signalled
    text = stacks.take("w1")
    assert "Current thread 0x" in text and "Thread 0x" in text
    assert "in one_step" in text and "in waiting_in_a_thread" in text
    assert "loss" not in text  # the worker's own output is not its stacks
    assert stacks.take("w2") == "" and stacks.take("w1") == ""  # taken once; w2 was never asked


def test_a_huge_dump_keeps_its_end():
    stacks = SignalStacks()
    stacks.expect("w")
    for i in range(5000):
        stacks.offer("w", f'  File "/deep/module_{i}.py", line {i} in frame_{i}')
    text = stacks.take("w")
    assert len(text) <= MAX_TEXT and text.endswith("in frame_4999")
