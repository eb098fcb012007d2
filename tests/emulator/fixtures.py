"""Fixtures for tests that run providers against emulators (used by the emulator and contract suites).

Every server listens on 127.0.0.1 with port 0 and lives for the session;
per-test fixtures clear its request log and pending faults. The autouse
``hermetic_cloud_env`` removes the developer's cloud credentials and points
every SDK's metadata/identity fallback at a closed loopback port, so no test
can reach a real cloud or a link-local metadata address. It also sends every
``https://`` request through a proxy on that closed port (loopback excepted):
SDKs make calls of their own, such as google-auth's background
``iamcredentials.googleapis.com`` access-boundary lookup after each token,
and those must fail at once here rather than reach, or wait for, the internet.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterator

import pytest

from cloud_elastic.providers import registry
from cloud_elastic.providers.api import HostDiscovery

CLOSED = "127.0.0.1:9"  # the discard port: nothing listens, connections are refused at once
_CLOUD_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCE_", "CLOUDSDK_", "IBMCLOUD_", "IC_", "VPC_", "IDENTITY_",
                   "MSI_", "IMDS_", "IBM_")
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def hermetic_cloud_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for name in list(os.environ):
        if name.startswith(_CLOUD_PREFIXES) or name.lower() in _PROXY_VARS:
            monkeypatch.delenv(name)
    empty = tmp_path_factory.mktemp("no-cloud-config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty / "aws-credentials"))
    monkeypatch.setenv("GCE_METADATA_HOST", CLOSED)
    monkeypatch.setenv("GCE_METADATA_IP", CLOSED)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(empty))
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(empty))
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"http://{CLOSED}/msi/token")  # never the IMDS probe
    monkeypatch.setenv("IDENTITY_HEADER", "none")
    monkeypatch.setenv("IBM_CREDENTIALS_FILE", str(empty / "ibm-credentials.env"))
    monkeypatch.setenv("HTTPS_PROXY", f"http://{CLOSED}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")


def record_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """From here on every ``time.sleep`` is recorded and cut to 10 ms: an SDK's waits (``Retry-After``,
    back-off) are asserted, not slept."""
    slept: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(min(seconds, 0.01))

    monkeypatch.setattr(time, "sleep", sleep)
    return slept


def provider(name: str, options: dict[str, str], slots_per_host: int | None = None) -> HostDiscovery:
    """Build a provider the way the CLI does: through its entry point."""
    return registry.load(name).from_options(options, slots_per_host=slots_per_host)


# -- AWS (moto) ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_proxy() -> Iterator["MotoProxy"]:
    from moto.server import ThreadedMotoServer

    from tests.emulator.moto_env import MotoProxy

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = MotoProxy(f"http://{host}:{port}").start()
    yield proxy
    proxy.stop()
    server.stop()


@pytest.fixture
def aws(moto_proxy: "MotoProxy", monkeypatch: pytest.MonkeyPatch) -> "MotoProxy":
    """The moto proxy, log cleared, with test credentials in the environment."""
    moto_proxy.reset()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return moto_proxy


# -- GCP ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator["FakeGCP"]:
    from tests.emulator.fake_gcp import FakeGCP

    with FakeGCP() as fake:
        fake.adc = fake.write_adc(tmp_path_factory.mktemp("gcp"))
        yield fake


@pytest.fixture
def gcp(gcp_server: "FakeGCP", monkeypatch: pytest.MonkeyPatch) -> "FakeGCP":
    """The Compute fake, log cleared, with Application Default Credentials pointing at it."""
    gcp_server.reset()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(gcp_server.adc))
    return gcp_server


# -- Azure --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def azure_server() -> Iterator["FakeAzure"]:
    from tests.emulator.fake_azure import FakeAzure

    with FakeAzure() as fake:
        yield fake


@pytest.fixture
def azure(azure_server: "FakeAzure", monkeypatch: pytest.MonkeyPatch) -> "FakeAzure":
    """The ARM fake, log cleared, with a managed identity (App Service variables) pointing at it."""
    from tests.emulator.fake_azure import IDENTITY_HEADER

    azure_server.reset()
    azure_server.page_size = 500
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"{azure_server.url}/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", IDENTITY_HEADER)
    return azure_server


# -- IBM ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ibm_server() -> Iterator["FakeIBM"]:
    from tests.emulator.fake_ibm import FakeIBM

    with FakeIBM() as fake:
        yield fake


@pytest.fixture
def ibm(ibm_server: "FakeIBM", monkeypatch: pytest.MonkeyPatch) -> "FakeIBM":
    """The VPC fake, log cleared, with an API key in IBMCLOUD_API_KEY."""
    from tests.emulator.fake_ibm import API_KEY

    ibm_server.reset()
    monkeypatch.setenv("IBMCLOUD_API_KEY", API_KEY)
    return ibm_server


def ibm_options(fake: "FakeIBM", group: str, **extra: str) -> dict[str, str]:
    return {"group": group, "region": "us-south", "endpoint": f"{fake.url}/v1", "iam_endpoint": fake.url, **extra}


def gcp_options(fake: "FakeGCP", group: str, **extra: str) -> dict[str, str]:
    base = {"group": group, "project": "proj-1", "endpoint": fake.url, "retry_deadline_s": "5"}
    if "region" not in extra:
        base["zone"] = "us-central1-a"
    return {**base, **extra}


def azure_options(fake: "FakeAzure", group: str, **extra: str) -> dict[str, str]:
    return {"group": group, "resource_group": "rg-1", "subscription": "sub-1", "endpoint": fake.url,
            "max_attempts": "3", **extra}


def aws_options(proxy: "MotoProxy", group: str, **extra: str) -> dict[str, str]:
    return {"group": group, "region": "us-east-1", "endpoint_url": proxy.url, "max_attempts": "3", **extra}


__all__ = [
    "hermetic_cloud_env", "moto_proxy", "aws", "gcp_server", "gcp", "azure_server", "azure", "ibm_server", "ibm",
    "provider", "ibm_options", "gcp_options", "azure_options", "aws_options", "CLOSED",
]
