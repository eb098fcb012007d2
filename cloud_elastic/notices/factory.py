"""Pick the watcher for a cloud, with its endpoint taken from the environment.

The endpoint overrides are the variables the clouds' own tools read, plus one
of ours for Azure (which has none):

==========  ===================================  ==================================
cloud       variable                             default
==========  ===================================  ==================================
aws         ``AWS_EC2_METADATA_SERVICE_ENDPOINT``  ``http://169.254.169.254`` (URL)
gcp         ``GCE_METADATA_HOST``                 ``metadata.google.internal`` (host[:port])
azure       ``CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT``  ``http://169.254.169.254`` (URL)
==========  ===================================  ==================================

``{host}`` anywhere in an override is replaced by the worker's host address,
so that on one machine each loopback "host" (127.0.0.2, 127.0.0.3, ...) can
reach its own fake metadata service on a shared port:
``AWS_EC2_METADATA_SERVICE_ENDPOINT=http://{host}:8111``.

AWS also honours ``AWS_EC2_METADATA_DISABLED=true`` (no watcher) and
``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`` (``http://[fd00:ec2::254]``),
as botocore does.
"""

from __future__ import annotations

import os
from typing import Any, Mapping
from urllib.parse import urlsplit

from cloud_elastic.errors import ConfigError

from .api import NoticeWatcher
from .aws_imds import DEFAULT_ENDPOINT as AWS_DEFAULT
from .aws_imds import AWSMetadataWatcher
from .azure_events import DEFAULT_ENDPOINT as AZURE_DEFAULT
from .azure_events import AzureScheduledEventsWatcher
from .gcp_metadata import DEFAULT_HOST as GCP_DEFAULT_HOST
from .gcp_metadata import GCPMetadataWatcher

__all__ = ["watcher_for", "endpoint_for", "check_endpoint", "CLOUDS", "ENV_AWS", "ENV_GCP", "ENV_AZURE", "HOST_PLACEHOLDER"]

CLOUDS = ("aws", "gcp", "azure")
ENV_AWS = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
ENV_AWS_MODE = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"
ENV_AWS_DISABLED = "AWS_EC2_METADATA_DISABLED"
ENV_GCP = "GCE_METADATA_HOST"
ENV_AZURE = "CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT"
HOST_PLACEHOLDER = "{host}"
AWS_IPV6_ENDPOINT = "http://[fd00:ec2::254]"


def _expand(value: str, host: str) -> str:
    if HOST_PLACEHOLDER in value:
        if not host:
            raise ConfigError(f"{value!r} uses {HOST_PLACEHOLDER} but no host address was given")
        value = value.replace(HOST_PLACEHOLDER, f"[{host}]" if ":" in host else host)
    return value


def _url(value: str, variable: str) -> str:
    parts = urlsplit(value)
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/") or parts.query:
        raise ConfigError(f"{variable} must be an http:// URL with no path, such as http://169.254.169.254, "
                          f"got {value!r}")
    try:
        parts.port
    except ValueError as exc:
        raise ConfigError(f"{variable}: bad port in {value!r}") from exc
    return value.rstrip("/")


def endpoint_for(cloud: str, host: str, env: Mapping[str, str]) -> str:
    """The metadata base URL the watcher for ``cloud`` on ``host`` uses; ConfigError for a bad override."""
    if cloud == "aws":
        value = env.get(ENV_AWS)
        if value:
            return _url(_expand(value, host), ENV_AWS)
        mode = env.get(ENV_AWS_MODE, "").strip().lower()
        if mode not in ("", "ipv4", "ipv6"):
            raise ConfigError(f"{ENV_AWS_MODE} must be IPv4 or IPv6, got {env.get(ENV_AWS_MODE)!r}")
        return AWS_IPV6_ENDPOINT if mode == "ipv6" else AWS_DEFAULT
    if cloud == "gcp":
        value = env.get(ENV_GCP)
        if not value:
            return f"http://{GCP_DEFAULT_HOST}"
        value = _expand(value, host)
        if "://" in value or "/" in value:
            raise ConfigError(f"{ENV_GCP} is host[:port] without a scheme or path, got {value!r}")
        return _url(f"http://{value}", ENV_GCP)
    if cloud == "azure":
        value = env.get(ENV_AZURE)
        return _url(_expand(value, host), ENV_AZURE) if value else AZURE_DEFAULT
    raise ConfigError(f"no notice watcher for cloud {cloud!r}; known: {', '.join(CLOUDS)}")


def watcher_for(cloud: str, host: str, env: Mapping[str, str] | None = None, **options: Any) -> NoticeWatcher | None:
    """The (unstarted) notice watcher for ``cloud`` on worker host ``host``, or None.

    None for a cloud without metadata notices (``ibm``, ``static``, ``none``...)
    and for AWS when ``AWS_EC2_METADATA_DISABLED=true``. ``env`` defaults to
    ``os.environ``; ``options`` go to the watcher's constructor (for example
    ``poll_interval_s``). A malformed endpoint override raises
    :class:`~cloud_elastic.errors.ConfigError`.
    """
    env = os.environ if env is None else env
    cloud = (cloud or "").strip().lower()
    if cloud not in CLOUDS:
        return None
    if cloud == "aws" and env.get(ENV_AWS_DISABLED, "").strip().lower() == "true":
        return None
    url = endpoint_for(cloud, host, env)
    if cloud == "aws":
        return AWSMetadataWatcher(url, **options)
    if cloud == "gcp":
        return GCPMetadataWatcher(url, **options)
    return AzureScheduledEventsWatcher(url, **options)


def check_endpoint(cloud: str | None, env: Mapping[str, str] | None = None) -> None:
    """ConfigError naming the variable when the endpoint override of ``cloud``'s watcher is malformed.

    The driver checks, before it starts the job, the environment its workers
    will get (``env``, default ``os.environ``): ``cloud-elastic run`` its own with
    the ``-x``/``--env`` values over it, ``ElasticRayExecutor`` its ``env_vars``.
    A worker cannot start a watcher with a malformed endpoint, and the job would
    run unwatched. ``cloud`` None (no watcher) or one without metadata notices:
    nothing to check.
    """
    watcher_for(cloud or "", "127.0.0.1", env)  # {host}: any address does, for the check
