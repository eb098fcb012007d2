"""Lazy import of PySpark: ``import cloud_elastic`` (and even ``cloud_elastic.spark``) never pulls it in."""

from __future__ import annotations

from types import ModuleType

from cloud_elastic.errors import require_module

__all__ = ["require_pyspark"]


def require_pyspark() -> ModuleType:
    """The ``pyspark`` module; a one-line :class:`MissingDependencyError` naming ``cloud-elastic[spark]`` without it."""
    return require_module("pyspark", package="pyspark", extra="spark", needed_by="cloud-elastic on Spark")
