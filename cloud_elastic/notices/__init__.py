"""Spot, preemption and maintenance notices read from a worker host's own metadata service.

One watcher per host: :func:`watcher_for` picks it by cloud and endpoint
(see :mod:`cloud_elastic.notices.factory` for the endpoint variables and the
``{host}`` convention), ``start(report)`` runs it on one daemon thread, and
``report`` receives each distinct :class:`Notice` once. What to do with a
notice is the driver's decision. ``python -m cloud_elastic.notices CLOUD``
runs a watcher by hand and prints what it sees. See docs/notices.md.
"""

import importlib
from typing import Any

from .api import KINDS, MAINTENANCE, REBALANCE, SOURCES, TERMINATE, Notice, NoticeWatcher, Report

#: Loaded on first use: the watchers bring in http.client and ssl, which the CLI's --help, ``providers`` and
#: shell completion (that import ``notices.api`` through the AWS provider) must not pay for.
_LAZY = {"AWSMetadataWatcher": "aws_imds", "AzureScheduledEventsWatcher": "azure_events",
         "GCPMetadataWatcher": "gcp_metadata", **{name: "factory" for name in (
             "CLOUDS", "ENV_AWS", "ENV_AZURE", "ENV_GCP", "HOST_PLACEHOLDER", "endpoint_for", "watcher_for")}}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "Notice", "NoticeWatcher", "Report", "TERMINATE", "REBALANCE", "MAINTENANCE", "KINDS", "SOURCES",
    "AWSMetadataWatcher", "GCPMetadataWatcher", "AzureScheduledEventsWatcher",
    "watcher_for", "endpoint_for", "CLOUDS", "ENV_AWS", "ENV_GCP", "ENV_AZURE", "HOST_PLACEHOLDER",
]
