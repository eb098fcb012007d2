"""Elastic training on Spark: workers run beside the tasks of a Spark stage.

::

    from cloud_elastic.spark import run_elastic
    results = run_elastic(train, num_proc=4, min_np=2, max_np=8)

Importing this package does not import PySpark; using it without PySpark
installed raises a one-line error naming ``cloud-elastic[spark]``. See ``docs/spark.md``.
"""

from __future__ import annotations

from cloud_elastic.spark.runner import run_elastic, spark_defaults

__all__ = ["run_elastic", "spark_defaults"]
