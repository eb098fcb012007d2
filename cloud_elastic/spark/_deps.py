"""Lazy import of PySpark: ``import cloud_elastic`` (and even ``cloud_elastic.spark``) never pulls it in."""

from __future__ import annotations

from types import ModuleType

from cloud_elastic.errors import MissingDependencyError

__all__ = ["require_pyspark"]


def require_pyspark() -> ModuleType:
    """The ``pyspark`` module; a one-line :class:`MissingDependencyError` naming ``cloud-elastic[spark]`` without it."""
    try:
        import pyspark
    except ImportError as exc:
        raise MissingDependencyError("pyspark", "spark", "cloud-elastic on Spark") from exc
    return pyspark
