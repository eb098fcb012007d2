"""Choosing a watcher and its endpoint from the cloud name and the environment."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.notices import (
    AWSMetadataWatcher,
    AzureScheduledEventsWatcher,
    GCPMetadataWatcher,
    endpoint_for,
    watcher_for,
)


@pytest.mark.parametrize(
    "cloud, kind, url",
    [
        ("aws", AWSMetadataWatcher, "http://169.254.169.254"),
        ("gcp", GCPMetadataWatcher, "http://metadata.google.internal"),
        ("azure", AzureScheduledEventsWatcher, "http://169.254.169.254"),
        ("AWS", AWSMetadataWatcher, "http://169.254.169.254"),
    ],
)
def test_each_cloud_gets_its_watcher_at_the_link_local_default(cloud, kind, url):
    watcher = watcher_for(cloud, "10.0.0.5", {})
    assert type(watcher) is kind and watcher.base_url == url


@pytest.mark.parametrize("cloud", ["ibm", "static", "script", "none", "", "auto"])
def test_clouds_without_metadata_notices_get_no_watcher(cloud):
    assert watcher_for(cloud, "10.0.0.5", {}) is None


def test_aws_metadata_disabled_means_no_watcher():
    assert watcher_for("aws", "h", {"AWS_EC2_METADATA_DISABLED": "true"}) is None
    assert watcher_for("aws", "h", {"AWS_EC2_METADATA_DISABLED": "false"}) is not None


@pytest.mark.parametrize(
    "cloud, env, host, url",
    [
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://{host}:8111/"}, "127.0.0.3", "http://127.0.0.3:8111"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://imds.test:80"}, "127.0.0.3", "http://imds.test:80"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}, "h", "http://[fd00:ec2::254]"),
        ("gcp", {"GCE_METADATA_HOST": "{host}:8112"}, "127.0.0.4", "http://127.0.0.4:8112"),
        ("gcp", {"GCE_METADATA_HOST": "metadata.test"}, "h", "http://metadata.test"),
        ("azure", {"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": "http://{host}:8113"}, "127.0.0.2", "http://127.0.0.2:8113"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://{host}:8111"}, "fd00::7", "http://[fd00::7]:8111"),
    ],
)
def test_endpoint_overrides_and_the_host_placeholder(cloud, env, host, url):
    assert endpoint_for(cloud, host, env) == url
    assert watcher_for(cloud, host, env).base_url == url


@pytest.mark.parametrize(
    "cloud, env, message",
    [
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "169.254.169.254"}, "must be an http:// URL"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "https://169.254.169.254"}, "must be an http:// URL"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://x/latest"}, "with no path"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://x:port"}, "bad port"),
        ("aws", {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv5"}, "IPv4 or IPv6"),
        ("gcp", {"GCE_METADATA_HOST": "http://metadata.test"}, "host\\[:port\\] without a scheme"),
        ("azure", {"CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT": "ftp://{host}"}, "CLOUD_ELASTIC_AZURE_IMDS_ENDPOINT must be"),
    ],
)
def test_malformed_overrides_are_one_line_config_errors(cloud, env, message):
    with pytest.raises(ConfigError, match=message) as info:
        watcher_for(cloud, "127.0.0.2", env)
    assert "\n" not in str(info.value)


def test_placeholder_without_a_host_is_a_config_error():
    with pytest.raises(ConfigError, match="no host address"):
        endpoint_for("aws", "", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://{host}:1"})


def test_constructing_a_watcher_does_no_io_and_starts_no_thread():
    import threading

    before = set(threading.enumerate())
    watcher = watcher_for("aws", "127.0.0.2", {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://{host}:9"})
    watcher.close()  # closing an unstarted watcher is harmless
    assert set(threading.enumerate()) == before


def test_options_reach_the_watcher_and_are_validated():
    assert watcher_for("gcp", "h", {}, poll_interval_s=0.5).poll_interval_s == 0.5
    with pytest.raises(ValueError, match="poll_interval_s must be > 0"):
        watcher_for("azure", "h", {}, poll_interval_s=0)
    with pytest.raises(ValueError, match="token_ttl_s"):
        watcher_for("aws", "h", {}, token_ttl_s=0)
