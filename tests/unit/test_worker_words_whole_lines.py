"""The worker's own words from its heartbeat thread (``driver_link.say``: the driver lost, the grace over) never
split a line the script writes at once, though both go to one pipe, unbuffered, as under a launcher, and the
heartbeat thread is held up after each write it makes (as on a loaded host, where it was seen: a script's line
glued to the end of "cannot reach the driver")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

_WORKER = textwrap.dedent("""
    import io, sys, threading, time
    from cloud_elastic.worker.link.driver_link import say
    class HeldUp(io.FileIO):
        def write(self, data):
            written = super().write(data)
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.002)  # the heartbeat thread descheduled after its write: the script writes on
            return written
    sys.stderr = io.TextIOWrapper(HeldUp(2, "w", closefd=False), write_through=True)
    def words():
        for n in range(300):
            say(f"cloud-elastic: worker w cannot reach the driver ({n})")
    thread = threading.Thread(target=words)
    thread.start()
    n = 0
    while thread.is_alive() or n < 300:
        sys.stdout.write(f"STEP {n}\\n")
        n += 1
    thread.join()
""")


def test_the_heartbeat_threads_words_and_the_scripts_lines_come_out_whole():
    proc = subprocess.run([sys.executable, "-c", _WORKER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=50)
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = proc.stdout.decode().splitlines()
    broken = [line for line in lines if not (line.startswith("STEP ") and line[5:].isdigit()
                                             or line.startswith("cloud-elastic: worker w cannot reach the driver ("))]
    assert not broken, (len(broken), [line for line in broken if line][:3])
    assert sum(line.startswith("cloud-elastic:") for line in lines) == 300
