"""The optional extras stay optional: nothing imports Ray or PySpark until they are used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.ray.conftest import REPO

pytestmark = pytest.mark.timeout(60)

# Makes `import ray` / `import pyspark` fail as if the extra were not installed.
_HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ray', 'pyspark'):
            raise ImportError('No module named ' + repr(name))
sys.meta_path.insert(0, Hide())
"""


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=50)


def test_importing_cloud_elastic_and_its_ray_and_spark_packages_pulls_in_neither_engine():
    out = _python(
        "import sys, cloud_elastic, cloud_elastic.ray, cloud_elastic.spark, cloud_elastic.torch\n"
        "print(sorted(m for m in ('ray', 'pyspark', 'py4j') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("call, extra", [
    ("from cloud_elastic.ray import ElasticRayExecutor as E\nE(E.create_settings(min_np=1)).start()", "ray"),
    ("from cloud_elastic.ray import RayHostDiscovery\nRayHostDiscovery().find()", "ray"),
    ("from cloud_elastic.spark import run_elastic\nrun_elastic(print, num_proc=1)", "spark"),
])
def test_a_missing_extra_is_a_one_line_error_naming_it(call, extra):
    out = _python(
        _HIDE + "from cloud_elastic.errors import MissingDependencyError\n"
        "try:\n" + "".join(f"    {line}\n" for line in call.splitlines()) +
        "except MissingDependencyError as exc:\n    print(exc)\n"
    )
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    assert len(message.splitlines()) == 1
    assert f"pip install 'cloud-elastic[{extra}]'" in message
    assert f"required for cloud-elastic on {extra.capitalize()}" in message, message
