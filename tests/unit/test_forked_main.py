"""A forked local worker runs its script as ``python SCRIPT`` would: the same ``__file__``, ``sys.argv`` and
``sys.path[0]`` (``forkserver_child.run_main``, compared with this Python run plainly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

# Reports what it was started as, then does what scripts do: changes directory and reads a file
# that lies beside it, found from __file__.
_REPORT = """
import json, os, sys
main = sys.modules["__main__"]
report = {"file": __file__, "argv": sys.argv, "path0": sys.path[0], "name": __name__,
          "main_file": main.__file__, "spec": getattr(__spec__, "name", None)}
os.chdir("/")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.txt")) as f:
    report["data"] = f.read()
print(json.dumps(report))
"""

# What the fork server's child runs once it has become the worker (its streams, environment and
# directory are the request's by then): here in a fresh interpreter, so this test's own stays untouched.
_FORKED = """
import json, sys
from cloud_elastic.driver.launch.forkserver_child import run_main
sys.exit(run_main(json.loads(sys.argv[1])))
"""


@pytest.fixture
def tree(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "report.py").write_text(_REPORT)
    (real / "data.txt").write_text("beside the script")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "report.py").symlink_to(real / "report.py")
    (tmp_path / "links" / "data.txt").write_text("beside the link")  # where ``__file__`` points
    return tmp_path


def _run(argv: list[str], cwd) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("script", ["real/report.py", "./real/../real/report.py", "links/report.py", "ABSOLUTE"])
def test_a_forked_script_sees_what_python_script_would_have_seen(tree, script):
    script = str(tree / "real" / "report.py") if script == "ABSOLUTE" else script
    plain = _run([sys.executable, script, "one", "two"], tree)
    forked = _run([sys.executable, "-c", _FORKED, json.dumps({"script": script, "args": ["one", "two"]})], tree)
    assert forked == plain
    assert forked["data"].startswith("beside the") and forked["argv"] == [script, "one", "two"]


def test_a_forked_module_sees_what_python_m_would_have_seen(tree):
    plain = _run([sys.executable, "-m", "report", "one"], tree / "real")
    forked = _run([sys.executable, "-c", _FORKED, json.dumps({"module": "report", "args": ["one"]})], tree / "real")
    assert forked == plain
    assert forked["name"] == "__main__" and forked["spec"] == "report" and forked["data"] == "beside the script"


def test_a_forked_directory_runs_its_main_as_python_dir_does(tree):
    # `python some_dir/` runs some_dir/__main__.py; the source-script path opened the directory (found by review).
    (tree / "app").mkdir()
    (tree / "app" / "__main__.py").write_text("import sys; print('ran', __name__, sys.argv[1:])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    plain = subprocess.run([sys.executable, "app", "x"], cwd=tree, env=env, capture_output=True, text=True, timeout=30)
    forked = subprocess.run([sys.executable, "-c", _FORKED, json.dumps({"script": "app", "args": ["x"]})], cwd=tree,
                            env=env, capture_output=True, text=True, timeout=30)
    assert plain.stdout == "ran __main__ ['x']\n"
    assert (forked.returncode, forked.stdout) == (0, plain.stdout), forked.stderr
