"""A forked local worker ends as ``python SCRIPT`` would, less the interpreter's teardown
(``forkserver_child._end_as_the_interpreter_would``): the same exit status, the message of
``sys.exit("message")``, the script's threads joined and its exit hooks run in the same order,
and what it left unflushed in a file it never closed written, compared with this Python run plainly (``tests/integration/test_forked_exit_job.py``: through a real driver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(90)

# Ends as ``ENDING`` says, after leaving a thread running, an exit hook, and a file written but never closed
# nor flushed (a metrics file a script keeps open).
_SCRIPT = """
import atexit, os, sys, threading, time
ending = sys.argv[1]
log = open(sys.argv[2], "w")
log.write("kept " * 1000)  # under the buffer's size: nothing reaches the file before the buffer is flushed
def late():
    time.sleep(0.3)
    print("thread done", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("exit hook", flush=True))
print("main done", flush=True)
if ending == "code":
    sys.exit(3)
if ending == "message":
    sys.exit("bye now")
if ending == "raise":
    raise ValueError("boom")
if ending == "interrupt":  # Ctrl-C in the script: the interpreter ends by SIGINT, after its exit steps
    raise KeyboardInterrupt
if ending == "huge":  # no C long holds it: status 255
    sys.exit(2**64 + 256)
"""

_FORKED = """
import json, sys
from cloud_elastic.driver.launch.forkserver_child import _end_as_the_interpreter_would, run_main
_end_as_the_interpreter_would(lambda: run_main(json.loads(sys.argv[1])))
"""


def _ran(argv: list[str], cwd, out) -> tuple[int, str, str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    with open(out) as f:
        written = f.read()
    return done.returncode, done.stdout, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "", written


@pytest.mark.parametrize("ending", ["return", "code", "message", "raise", "interrupt", "huge"])
def test_a_forked_worker_ends_with_what_python_script_would_have_given(tmp_path, ending):
    (tmp_path / "script.py").write_text(_SCRIPT)
    plain = _ran([sys.executable, "script.py", ending, str(tmp_path / "plain.txt")], tmp_path, tmp_path / "plain.txt")
    request = {"script": "script.py", "args": [ending, str(tmp_path / "forked.txt")]}
    forked = _ran([sys.executable, "-c", _FORKED, json.dumps(request)], tmp_path, tmp_path / "forked.txt")
    assert forked == plain
    code, stdout, last_error, written = forked
    assert code == {"return": 0, "code": 3, "message": 1, "raise": 1, "interrupt": -2, "huge": 255}[ending]
    assert stdout == "main done\nthread done\nexit hook\n"  # the thread joined before the hooks, as at exit
    assert last_error == {"return": "", "code": "", "message": "bye now", "raise": "ValueError: boom",
                          "interrupt": "KeyboardInterrupt", "huge": ""}[ending]
    assert written == "kept " * 1000



# Registers two finalizers run at exit: one as torch registers its operator libraries' (``torch.library._del_library``,
# faked here: the test needs no torch import) and the script's own.
_FINALIZERS = """
import sys, types, weakref
library = sys.modules.setdefault("torch.library", types.ModuleType("torch.library"))
def _del_library(*args):
    print("torch's operator teardown", flush=True)
library._del_library = _del_library
class Held: pass
held = [Held(), Held()]
weakref.finalize(held[0], library._del_library)
weakref.finalize(held[1], lambda: print("the script's finalizer", flush=True))
print("main done", flush=True)
"""


def test_a_forked_worker_leaves_out_only_torchs_operator_teardown_at_exit(tmp_path):
    # torch's ~170 operator-library finalizers only take its operators out of the dispatcher's tables, which the
    # process's end drops anyway; run in a forked worker they copied the pages it shares with the server (40 ms a
    # worker). A script's own finalizers still run at its exit.
    (tmp_path / "script.py").write_text(_FINALIZERS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    plain = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    forked = subprocess.run([sys.executable, "-c", _FORKED, json.dumps({"script": "script.py", "args": []})],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (plain.returncode, forked.returncode) == (0, 0), (plain.stderr, forked.stderr)
    assert sorted(plain.stdout.splitlines()) == ["main done", "the script's finalizer", "torch's operator teardown"]
    assert forked.stdout.splitlines() == ["main done", "the script's finalizer"]
