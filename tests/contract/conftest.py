"""Contract suite: the emulator fixtures, so cloud providers run against their emulators here too."""

from tests.emulator.fixtures import aws, azure, azure_server, gcp, gcp_server, hermetic_cloud_env, ibm, ibm_server, moto_proxy  # noqa: F401
from tests.emulator.fake_kubernetes import kubernetes, kubernetes_server  # noqa: F401,E402
