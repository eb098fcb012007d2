"""A local Spark (``local[3,4]``: three task slots, a task may fail four times) for the Spark executor tests.

Needs PySpark and a Java runtime (``scripts/setup-java.sh`` installs one); the
tests skip with the reason when either is missing.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'cloud-elastic[spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if os.environ.get("CI"):  # ./dev test installs one; in CI its absence is a failure, not a skip
            pytest.fail("CI must have a Java runtime for PySpark (scripts/setup-java.sh)", pytrace=False)
        pytest.skip("no Java runtime (run scripts/setup-java.sh)")
    from pyspark.sql import SparkSession

    # Executors' Python workers import this checkout like the driver does, with the same
    # interpreter (else Spark runs "python3" from PATH, which may lack torch).
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[3,4]")
        .appName("cloud-elastic-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.python.worker.reuse", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()
