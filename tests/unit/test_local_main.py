"""A local worker started from scratch runs its script through ``driver.launch.local_main`` (so that it can say its
exit code to a driver that adopts it): what the user sees is what ``python SCRIPT`` gives, compared with this
Python run plainly: the same exit status, standard output and error (tracebacks, ``sys.exit("message")``), threads
joined and exit hooks run in the same order, and, unlike a forked worker, the interpreter's teardown (a finalizer
runs, a file left open is flushed by it). ``tests/integration/test_adopted_plain_exit.py`` runs it under a driver."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cloud_elastic.driver.launch.local_main import MODULE, through_main
from tests.unit.test_forked_exit import _SCRIPT

pytestmark = pytest.mark.timeout(90)

# A finalizer only the interpreter's teardown runs (a forked worker skips it).
_WITH_FINALIZER = "class Kept:\n    def __del__(self):\n        print('finalized', flush=True)\nkept = Kept()\n" + _SCRIPT


def _ran(argv: list[str], cwd, out) -> tuple[int, str, str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    with open(out) as f:
        written = f.read()
    return done.returncode, done.stdout, done.stderr, written


@pytest.mark.parametrize("ending", ["return", "code", "message", "raise", "interrupt", "huge"])
def test_a_script_run_through_local_main_ends_as_python_script_would(tmp_path, ending):
    (tmp_path / "script.py").write_text(_WITH_FINALIZER)
    plain = _ran([sys.executable, "script.py", ending, "plain.txt"], tmp_path, tmp_path / "plain.txt")
    command = [sys.executable, "-u", "script.py", ending, "ours.txt"]
    ours = _ran(through_main(command, {"script": "script.py"}), tmp_path, tmp_path / "ours.txt")
    assert ours == plain
    code, stdout, stderr, written = ours
    assert code == {"return": 0, "code": 3, "message": 1, "raise": 1, "interrupt": -2, "huge": 255}[ending]
    assert stdout == "main done\nthread done\nexit hook\nfinalized\n"
    assert (stderr.strip().splitlines() or [""])[-1] == {
        "return": "", "code": "", "message": "bye now", "raise": "ValueError: boom", "interrupt": "KeyboardInterrupt",
        "huge": ""}[ending]
    assert stderr.count("Traceback") == (ending in ("raise", "interrupt"))  # printed once, as the interpreter does
    assert written == "kept " * 1000


def test_a_module_run_through_local_main_sees_what_python_m_gives_it(tmp_path):
    (tmp_path / "mod.py").write_text("import os, sys\nprint(sys.argv, sys.path[0] == os.getcwd(), __name__)\n"
                                     "sys.exit(4)\n")
    command = [sys.executable, "-m", "mod", "a", "b"]
    plain = _ran(command, tmp_path, os.devnull)
    assert through_main(command, {"module": "mod"})[1:5] == ["-m", MODULE, "-m", "mod"]
    assert _ran(through_main(command, {"module": "mod"}), tmp_path, os.devnull) == plain
    assert plain[:2] == (4, f"[{str(tmp_path / 'mod.py')!r}, 'a', 'b'] True __main__\n")


def test_a_command_of_another_shape_is_left_as_it_is():
    assert through_main(["bash", "-c", "exit 3"], None) == ["bash", "-c", "exit 3"]


@pytest.mark.parametrize("form", ["script", "module"])
def test_under_pythonsafepath_the_first_pythonpath_entry_stays_and_nothing_is_added(tmp_path, form):
    """``PYTHONSAFEPATH=1``: python adds neither the script's directory nor the working directory to ``sys.path``,
    so ``sys.path[0]`` is the first ``PYTHONPATH`` entry; local_main must keep it (review s61 rvD finding 1)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mylib.py").write_text("VALUE = 7\n")
    body = "import os, sys, mylib\nprint(mylib.VALUE, os.getcwd() in sys.path)\n"
    (lib / "trainmod.py").write_text(body)
    (tmp_path / "train.py").write_text(body)
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join([str(lib), *sys.path])}
    command = [sys.executable, "train.py"] if form == "script" else [sys.executable, "-m", "trainmod"]
    shape = {"script": "train.py"} if form == "script" else {"module": "trainmod"}
    runs = [subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
            for argv in (command, through_main(command, shape))]
    assert [(r.returncode, r.stdout, r.stderr) for r in runs] == [(0, "7 False\n", "")] * 2
