"""Lazy import of Ray: ``import cloud_elastic`` (and even ``cloud_elastic.ray``) never pulls it in."""

from __future__ import annotations

from types import ModuleType

from cloud_elastic.errors import require_module

__all__ = ["require_ray"]


def require_ray() -> ModuleType:
    """The ``ray`` module; a one-line :class:`MissingDependencyError` naming ``cloud-elastic[ray]`` without it."""
    return require_module("ray", package="ray", extra="ray", needed_by="cloud-elastic on Ray")
