"""The state-mapping tables of the four cloud providers, row by row (pure functions, no SDK)."""

from __future__ import annotations

import pytest

from cloud_elastic.providers import aws, azure, gcp, ibm
from cloud_elastic.providers._common import ABSENT, READY, absent, draining


@pytest.mark.parametrize(("lifecycle", "health", "ec2", "verdict"), [
    ("InService", "Healthy", "running", READY),
    ("InService", "Unhealthy", "running", draining("Unhealthy")),
    ("InService", "Healthy", "stopping", draining("EC2 stopping")),
    ("InService", "Healthy", "stopped", draining("EC2 stopped")),
    ("InService", "Healthy", "shutting-down", draining("EC2 shutting-down")),
    ("InService", "Healthy", "pending", ABSENT),
    ("InService", "Healthy", None, ABSENT),  # EC2 did not describe it (yet)
    ("Terminating", "Healthy", "running", draining("Terminating")),
    ("Terminating:Wait", "Healthy", "running", draining("Terminating:Wait")),
    ("Terminating:Proceed", "Unhealthy", "running", draining("Terminating:Proceed")),
    ("Detaching", "Healthy", "running", draining("Detaching")),
    ("EnteringStandby", "Healthy", "running", draining("EnteringStandby")),
    ("Standby", "Healthy", "running", draining("Standby")),
    # A root-volume replacement reboots the instance under its workers: they leave, the host does not vanish.
    ("ReplacingRootVolume", "Healthy", "running", draining("ReplacingRootVolume")),
    ("ReplacingRootVolume:Wait", "Healthy", "running", draining("ReplacingRootVolume:Wait")),
    ("ReplacingRootVolume:Proceed", "Healthy", "running", draining("ReplacingRootVolume:Proceed")),
    ("RootVolumeReplaced", "Healthy", "running", draining("RootVolumeReplaced")),
    ("SomeFutureState", "Healthy", "running", draining("SomeFutureState")),  # unknown: leaving is the safer reading
    ("Pending", "Healthy", "pending", ABSENT),
    ("Pending:Wait", "Healthy", "running", ABSENT),
    ("Warmed:Running", "Healthy", "running", ABSENT),
    ("Warmed:Terminating", "Healthy", "running", ABSENT),  # a warm-pool instance never ran workers
    ("Detached", "Healthy", "running", ABSENT),
    ("Terminated", "Healthy", "terminated", ABSENT),
])
def test_aws(lifecycle, health, ec2, verdict):
    assert aws.classify(lifecycle, health, ec2) == verdict


@pytest.mark.parametrize(("action", "status", "health", "verdict"), [
    ("NONE", "RUNNING", [], READY),
    ("NONE", "RUNNING", ["HEALTHY"], READY),
    ("NONE", "RUNNING", ["UNKNOWN"], READY),
    ("REFRESHING", "RUNNING", [], READY),
    ("DELETING", "RUNNING", [], draining("DELETING")),
    ("ABANDONING", "RUNNING", [], draining("ABANDONING")),
    ("RECREATING", "TERMINATED", [], draining("RECREATING")),
    ("RESTARTING", "RUNNING", [], draining("RESTARTING")),
    ("STOPPING", "RUNNING", [], draining("STOPPING")),
    ("SUSPENDING", "RUNNING", [], draining("SUSPENDING")),
    ("NONE", "STOPPING", [], draining("instance STOPPING")),
    ("NONE", "PENDING_STOP", [], draining("instance PENDING_STOP")),  # graceful shutdown under way
    ("NONE", "REPAIRING", [], draining("instance REPAIRING")),
    # Off: a stopped or suspended pool (targetStoppedSize/targetSuspendedSize), a preempted Spot VM not yet
    # recreated. Nothing runs there, so the host is absent, not leaving forever.
    ("NONE", "TERMINATED", [], absent("instance TERMINATED")),
    ("NONE", "STOPPED", [], absent("instance STOPPED")),
    ("NONE", "SUSPENDED", [], absent("instance SUSPENDED")),
    ("STARTING", "STOPPED", [], absent("instance STOPPED")),
    ("DELETING", "STOPPED", [], draining("DELETING")),
    ("NONE", "RUNNING", ["UNHEALTHY"], draining("unhealthy")),
    ("NONE", "RUNNING", ["TIMEOUT"], draining("unhealthy")),
    ("NONE", "RUNNING", ["DRAINING"], draining("draining")),
    ("CREATING", "PROVISIONING", [], ABSENT),
    ("CREATING_WITHOUT_RETRIES", "STAGING", [], ABSENT),
    ("VERIFYING", "RUNNING", [], ABSENT),
    ("STARTING", "STAGING", [], ABSENT),
    ("NONE", "STAGING", [], ABSENT),
])
def test_gcp(action, status, health, verdict):
    assert gcp.classify(action, status, health) == verdict


def test_gcp_deadline_goes_on_drains_the_cloud_is_carrying_out():
    assert gcp.classify("DELETING", "RUNNING", [], 1767225600.0) == draining("DELETING", 1767225600.0)
    assert gcp.classify("NONE", "PENDING_STOP", [], 1767225600.0) == draining("instance PENDING_STOP", 1767225600.0)
    # A failing health check is not the cloud taking the host: no deadline to force its workers out by.
    assert gcp.classify("NONE", "RUNNING", ["UNHEALTHY"], 5.0) == draining("unhealthy")
    assert gcp.classify("NONE", "RUNNING", [], 1767225600.0) == READY


@pytest.mark.parametrize(("provisioning", "codes", "verdict"), [
    ("Succeeded", ["ProvisioningState/succeeded", "PowerState/running"], READY),
    ("Updating", ["PowerState/running"], READY),
    ("Succeeded", ["PowerState/running", "HealthState/healthy"], READY),
    ("Succeeded", ["PowerState/running", "HealthState/unhealthy"], draining("unhealthy")),
    ("Deleting", ["PowerState/running"], draining("Deleting")),
    # Failed on a scale set is mostly a failed extension on a VM that runs fine: judged by power and health.
    ("Failed", ["ProvisioningState/failed/VMExtensionProvisioningError", "PowerState/running"], READY),
    ("Failed", ["PowerState/running", "HealthState/unhealthy"], draining("unhealthy")),
    ("Failed", ["PowerState/stopping"], draining("PowerState/stopping")),
    ("Failed", [], ABSENT),
    ("Succeeded", ["PowerState/stopping"], draining("PowerState/stopping")),
    ("Succeeded", ["PowerState/deallocating"], draining("PowerState/deallocating")),
    # Off: nothing runs there (an evicted Spot VM stays deallocated), so absent rather than draining forever.
    ("Succeeded", ["PowerState/stopped"], absent("PowerState/stopped")),
    ("Succeeded", ["PowerState/deallocated"], absent("PowerState/deallocated")),
    ("Deleting", ["PowerState/deallocated"], draining("Deleting")),
    ("Creating", ["PowerState/starting"], ABSENT),
    ("Succeeded", ["PowerState/starting"], ABSENT),
    ("Succeeded", [], ABSENT),  # no instance view
    ("Migrating", ["PowerState/running"], ABSENT),
])
def test_azure(provisioning, codes, verdict):
    assert azure.classify(provisioning, codes) == verdict


def test_azure_standby_pool_members_are_absent_whatever_their_power_state():
    for codes in (["PowerState/running"], ["PowerState/deallocated"]):
        assert azure.classify("Succeeded", codes, standby=True) == absent("in the scale set's standby pool")


@pytest.mark.parametrize(("membership", "status", "reasons", "lifecycle", "verdict"), [
    ("healthy", "running", [], "stable", READY),
    ("deleting", "running", [], "stable", draining("membership deleting")),
    ("failed", "running", [], "stable", draining("membership failed")),
    ("unhealthy", "running", [], "stable", draining("membership unhealthy")),
    ("healthy", "stopping", ["stopped_by_preemption"], "stable", draining("preempted")),
    ("healthy", "stopping", [], "stable", draining("instance stopping")),
    # Stopped runs nothing: absent (logged once), not draining forever.
    ("healthy", "stopped", ["stopped_by_preemption"], "stable", absent("preempted")),
    ("healthy", "stopped", [], "stable", absent("instance stopped")),
    ("unhealthy", "stopped", [], "stable", draining("membership unhealthy")),
    ("healthy", "restarting", [], "stable", draining("instance restarting")),
    ("healthy", "running", [], "deleting", draining("instance deleting")),
    ("healthy", "running", [], "suspended", draining("instance suspended")),  # a lifecycle_state, not a status
    ("pending", "starting", [], "pending", ABSENT),
    ("healthy", "pending", [], "pending", ABSENT),
    ("healthy", "starting", [], "stable", ABSENT),
])
def test_ibm(membership, status, reasons, lifecycle, verdict):
    assert ibm.classify(membership, status, reasons, lifecycle) == verdict


@pytest.mark.parametrize(("health", "verdict"), [
    ("ok", READY), ("degraded", READY), ("inapplicable", READY), ("faulted", draining("instance faulted")), ("", READY),
])
def test_ibm_health_state(health, verdict):
    assert ibm.classify("healthy", "running", [], "stable", health) == verdict
