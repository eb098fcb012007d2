"""Emulator suite: real SDK clients over HTTP to moto and local fake clouds (see fixtures.py)."""

from tests.emulator.fixtures import aws, azure, azure_server, gcp, gcp_server, hermetic_cloud_env, ibm, ibm_server, moto_proxy  # noqa: F401
# Owners of event kinds must check them (events_check.OWNERS), as in the integration suite.
from tests.integration.events_check import pytest_runtest_call, pytest_runtest_makereport  # noqa: F401,E402
