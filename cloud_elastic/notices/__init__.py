"""Spot, preemption and maintenance notices read from a worker host's own metadata service.

One watcher per host: :func:`watcher_for` picks it by cloud and endpoint
(see :mod:`cloud_elastic.notices.factory` for the endpoint variables and the
``{host}`` convention), ``start(report)`` runs it on one daemon thread, and
``report`` receives each distinct :class:`Notice` once. What to do with a
notice is the driver's decision. ``python -m cloud_elastic.notices CLOUD``
runs a watcher by hand and prints what it sees. See docs/notices.md.
"""

from .api import KINDS, MAINTENANCE, REBALANCE, SOURCES, TERMINATE, Notice, NoticeWatcher, Report
from .aws_imds import AWSMetadataWatcher
from .azure_events import AzureScheduledEventsWatcher
from .factory import CLOUDS, ENV_AWS, ENV_AZURE, ENV_GCP, HOST_PLACEHOLDER, endpoint_for, watcher_for
from .gcp_metadata import GCPMetadataWatcher

__all__ = [
    "Notice", "NoticeWatcher", "Report", "TERMINATE", "REBALANCE", "MAINTENANCE", "KINDS", "SOURCES",
    "AWSMetadataWatcher", "GCPMetadataWatcher", "AzureScheduledEventsWatcher",
    "watcher_for", "endpoint_for", "CLOUDS", "ENV_AWS", "ENV_GCP", "ENV_AZURE", "HOST_PLACEHOLDER",
]
