"""A local Spark (``local[2,4]``: two task slots, a task may fail four times) for the Spark executor tests.

Two slots are what the tests need: no job has more than two workers, and the queued-tasks test queues two
more tasks behind them (each worker is a fresh interpreter importing torch: 4-5 CPU-s).

Needs PySpark and a Java runtime (``scripts/setup-java.sh`` installs one); the
tests skip with the reason when either is missing.

Spark talks over loopback only: left alone, it advertises the machine's own
interface address for its driver and block manager. ``SPARK_LOCAL_IP`` and
``spark.driver.host``/``bindAddress`` pin them to 127.0.0.1, and the fixture
fails if a block manager still advertises another address.

The driver's JVM compiles with C1 alone and collects with the serial collector
(:data:`JVM_OPTIONS`): the tests' Spark jobs are a few small stages, and its
JIT threads were most of the JVM's CPU. Measured here, the JVM's CPU time to
start and run three small jobs fell from 13 s to 7 s; in CI its start shares
two cores with both Ray lanes and the jobs lane (77 s of set-up).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
#: The driver JVM's options (see the module docstring); spark-submit reads them when it starts that JVM.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def check_loopback(session) -> None:
    """Fail unless the driver and every executor (in local mode: the driver's own) advertise an address in
    127.0.0.0/8."""
    context = session.sparkContext
    advertised = {context.getConf().get("spark.driver.host")}
    advertised |= {info.host() for info in context._jsc.sc().statusTracker().getExecutorInfos()}
    outside = sorted(a for a in advertised if not ipaddress.ip_address(a).is_loopback)
    assert not outside, f"the test Spark advertises non-loopback addresses {outside} (all: {sorted(advertised)})"


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
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK  # read by the JVM this session starts
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("cloud-elastic-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.driver.host", LOOPBACK)
        .config("spark.driver.bindAddress", LOOPBACK)
        .getOrCreate()
    )
    try:
        check_loopback(session)
        yield session
    finally:
        session.stop()
