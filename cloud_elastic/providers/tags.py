"""Tag/label names shared by the discovery providers and the Terraform modules.

The Terraform tests import these constants instead of repeating them, so the
names a provider looks up and the names the modules write cannot drift apart.
Every cloud accepts these spellings (GCP labels need lowercase, digits, ``-``
and ``_``; IBM user tags are written ``key:value``).
"""

from __future__ import annotations

__all__ = ["ROLE_TAG", "CLUSTER_TAG", "ROLE_WORKER", "ROLE_DRIVER"]

#: Tag key whose value says what an instance or group is for.
ROLE_TAG = "cloud-elastic-role"
#: Tag key whose value is the cluster (deployment) name.
CLUSTER_TAG = "cloud-elastic-cluster"
#: ``ROLE_TAG`` value on the GPU worker group and its instances.
ROLE_WORKER = "worker"
#: ``ROLE_TAG`` value on the CPU driver instance.
ROLE_DRIVER = "driver"
