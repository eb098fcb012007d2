"""The HostDiscovery contract, one suite for every provider.

Built-in (static, script), third-party (the example ``hostsfile`` plugin,
found through its entry point), an in-memory fake (``ScriptedDiscovery``),
the four clouds against their emulators and Kubernetes against its fake API
server. Each case supplies how to
build the provider, the snapshot it must return (cloud snapshots name the
cloud's instance behind every host), and a broken variant that must fail
with a DiscoveryError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from cloud_elastic.errors import ConfigError, DiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers import registry
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery
from tests.contract.scripted import ScriptedDiscovery
from tests.emulator.fixtures import aws_options, azure_options, gcp_options, ibm_options

# The first test of a provider in a process imports its SDK: google.cloud.compute_v1 takes 8 s warm on this
# machine, and in a fresh clone (nothing compiled yet) under CI's load it passed 60 s twice this week.
pytestmark = pytest.mark.timeout(180)


@dataclass
class Case:
    cls: type[HostDiscovery]
    options: dict[str, str]
    expected: DiscoveredHosts
    broken_options: dict[str, str] | None = None  # valid options whose find() must raise DiscoveryError
    build: Callable[[int | None], HostDiscovery] | None = None  # for providers without an entry point
    broken: Callable[[], HostDiscovery] | None = None
    server: object | None = None  # the emulator, to check construction does no I/O
    registered: bool = True
    user_slots: frozenset[str] = frozenset()  # hosts the user wrote host:slots for: that count stays

    def make(self, slots_per_host: int | None = None) -> HostDiscovery:
        if self.build is not None:
            return self.build(slots_per_host)
        return self.cls.from_options(self.options, slots_per_host=slots_per_host)

    def make_broken(self) -> HostDiscovery | None:
        if self.broken is not None:
            return self.broken()
        if self.broken_options is not None:
            return self.cls.from_options(self.broken_options)
        return None


_scenes: dict[tuple[str, int], object] = {}


def _once(key: str, server: object, create: Callable[[], object]) -> object:
    """Build a cloud scene once per emulator server (they live for the session)."""
    slot = (key, id(server))
    if slot not in _scenes:
        _scenes[slot] = create()
    return _scenes[slot]


def _static(request, tmp_path: Path) -> Case:
    return Case(registry.load("static"), {"hosts": "10.0.0.1:2,10.0.0.2"},
                DiscoveredHosts(ready={"10.0.0.1": 2, "10.0.0.2": 1}), user_slots=frozenset({"10.0.0.1"}))


def _script(request, tmp_path: Path) -> Case:
    good, bad = tmp_path / "hosts.sh", tmp_path / "broken.sh"
    good.write_text("#!/bin/sh\necho 10.0.0.1:4\necho 10.0.0.2\n")
    bad.write_text("#!/bin/sh\necho 'no hosts today' >&2\nexit 3\n")
    for path in (good, bad):
        path.chmod(0o755)
    return Case(registry.load("script"), {"path": str(good)}, DiscoveredHosts(ready={"10.0.0.1": 4, "10.0.0.2": 1}),
                broken_options={"path": str(bad)}, user_slots=frozenset({"10.0.0.1"}))


def _scripted(request, tmp_path: Path) -> Case:
    snapshot = DiscoveredHosts(ready={"10.0.0.1": 2}, draining={"10.0.0.9": Drain(None, "scripted")})
    return Case(ScriptedDiscovery, {"hosts": "10.0.0.1:2"}, snapshot, registered=False,
                build=lambda sph: ScriptedDiscovery([snapshot], slots_per_host=sph),
                broken=lambda: ScriptedDiscovery([RetryableDiscoveryError("scripted outage")]))


def _hostsfile(request, tmp_path: Path) -> Case:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"ready": {"10.0.0.1": 8}, "draining": {"10.0.0.2": {"reason": "maintenance",
                                                                                  "deadline": 1767225600}}}))
    expected = DiscoveredHosts(ready={"10.0.0.1": 8}, draining={"10.0.0.2": Drain(1767225600.0, "maintenance")})
    return Case(registry.load("hostsfile"), {"path": str(path)}, expected,
                broken_options={"path": str(tmp_path / "missing.json")})


def _cloud(request, name: str, group: str, options: Callable, scene: Callable[[object], DiscoveredHosts]) -> Case:
    """A cloud case: ``scene(server)`` builds the group once per emulator and returns the expected snapshot."""
    server = request.getfixturevalue(name)
    expected = _once(name, server, lambda: scene(server))
    return Case(registry.load(name), options(server, group), expected,
                broken_options=options(server, f"{group}-missing"), server=server)


def _aws(request, tmp_path: Path) -> Case:
    from tests.emulator.moto_env import make_group, set_member

    def scene(proxy) -> DiscoveredHosts:
        members = make_group(proxy.url, "contract", size=3, instance_type="g4dn.xlarge", cidr="10.70.1.0/24")
        set_member("contract", members[2]["id"], lifecycle="Terminating:Wait")
        return DiscoveredHosts(ready={m["ip"]: 1 for m in members[:2]},
                               draining={members[2]["ip"]: Drain(None, "Terminating:Wait")},
                               instances={m["ip"]: m["id"] for m in members})

    return _cloud(request, "aws", "contract", aws_options, scene)


def _gcp(request, tmp_path: Path) -> Case:
    from tests.emulator.fake_gcp import Member

    def scene(fake) -> DiscoveredHosts:
        members = [Member(f"contract-{i}", "us-central1-a", ip=f"10.71.0.{i + 1}", accelerators=1) for i in range(3)]
        members[2].action = "DELETING"
        fake.add_group("proj-1", "contract", members, zone="us-central1-a")
        return DiscoveredHosts(ready={"10.71.0.1": 1, "10.71.0.2": 1}, draining={"10.71.0.3": Drain(None, "DELETING")},
                               instances={m.ip: m.instance_id for m in members})

    return _cloud(request, "gcp", "contract", gcp_options, scene)


def _azure(request, tmp_path: Path) -> Case:
    from tests.emulator.fake_azure import VM

    def scene(fake) -> DiscoveredHosts:
        vms = [VM(f"c{i}", ip=f"10.72.0.{i + 1}", size="Standard_NC6s_v3") for i in range(3)]
        vms[2].provisioning = "Deleting"
        fake.add_scale_set("sub-1", "rg-1", "contract", vms)
        return DiscoveredHosts(ready={"10.72.0.1": 1, "10.72.0.2": 1}, draining={"10.72.0.3": Drain(None, "Deleting")},
                               instances={vm.ip: f"contract_{i}" for i, vm in enumerate(vms)})

    return _cloud(request, "azure", "contract", azure_options, scene)


def _ibm(request, tmp_path: Path) -> Case:
    from tests.emulator.fake_ibm import Member

    def scene(fake) -> DiscoveredHosts:
        members = [Member(f"c{i}", ip=f"10.73.0.{i + 1}", profile="gx3-16x80x1l4") for i in range(3)]
        members[2].membership = "deleting"
        fake.add_group("grp-contract", members)
        return DiscoveredHosts(ready={"10.73.0.1": 1, "10.73.0.2": 1},
                               draining={"10.73.0.3": Drain(None, "membership deleting")},
                               instances={m.ip: f"i-{m.name}" for m in members})

    return _cloud(request, "ibm", "grp-contract", ibm_options, scene)


def _kubernetes(request, tmp_path: Path) -> Case:
    from tests.emulator.fake_kubernetes import kubernetes_options

    def scene(fake) -> DiscoveredHosts:
        pods = [fake.add_pod(f"contract-{i}", f"10.75.0.{i + 1}", namespace="contract", node="contract-node",
                             gpus=1, created=float(i)) for i in range(3)]
        leaving = fake.delete_pod("contract-2", grace_s=60, namespace="contract")
        return DiscoveredHosts(ready={"10.75.0.1": 1, "10.75.0.2": 1},
                               draining={"10.75.0.3": Drain(float(int(leaving.deletion)), "pod deleted")},
                               instances={p.ip: f"{p.name}/{p.uid}/0" for p in pods})

    server = request.getfixturevalue("kubernetes")
    expected = _once("kubernetes", server, lambda: scene(server))
    server.forbid("pods", "contract-forbidden")  # the broken case: a namespace the driver may not read
    return Case(registry.load("kubernetes"), kubernetes_options(server, "contract"), expected,
                broken_options=kubernetes_options(server, "contract-forbidden"), server=server)


BUILDERS = {"static": _static, "script": _script, "scripted": _scripted, "hostsfile": _hostsfile,
            "aws": _aws, "gcp": _gcp, "azure": _azure, "ibm": _ibm, "kubernetes": _kubernetes}


#: Providers with a failure mode at discovery time. ``static`` has none: a bad host
#: list is refused when it is built (tests/unit/test_static_provider.py).
FAILING = sorted(set(BUILDERS) - {"static"})
#: Providers that talk to an emulator, whose request log shows any I/O; their hosts are cloud instances.
EMULATED = ["aws", "azure", "gcp", "ibm", "kubernetes"]


@pytest.fixture(params=sorted(BUILDERS))
def case(request, tmp_path) -> Case:
    return BUILDERS[request.param](request, tmp_path)


@pytest.fixture(params=FAILING)
def failing_case(request, tmp_path) -> Case:
    return BUILDERS[request.param](request, tmp_path)


@pytest.fixture(params=EMULATED)
def emulated_case(request, tmp_path) -> Case:
    return BUILDERS[request.param](request, tmp_path)


def test_find_returns_the_complete_snapshot(case):
    discovery = case.make()
    try:
        snapshot = discovery.find()
    finally:
        discovery.close()
    assert snapshot == case.expected
    assert all(isinstance(s, int) and s >= 1 for s in snapshot.ready.values())
    assert not set(snapshot.ready) & set(snapshot.draining)


def test_find_is_idempotent(case):
    discovery = case.make()
    try:
        assert discovery.find() == discovery.find()
    finally:
        discovery.close()


def test_slots_per_host_wins_over_discovered_slots(case):
    discovery = case.make(slots_per_host=3)
    snapshot = discovery.find()
    discovery.close()
    # An explicit host:slots the user wrote (static list, script output) is not "discovered": it stays.
    assert dict(snapshot.ready) == {h: case.expected.ready[h] if h in case.user_slots else 3 for h in case.expected.ready}
    assert snapshot.draining == case.expected.draining
    assert snapshot.instances == case.expected.instances


def test_cloud_snapshots_name_the_instance_behind_every_host(case):
    discovery = case.make()
    try:
        snapshot = discovery.find()
    finally:
        discovery.close()
    hosts = set(snapshot.ready) | set(snapshot.draining)
    if case.cls.name in EMULATED:
        assert set(snapshot.instances) == hosts
        assert all(isinstance(i, str) and i for i in snapshot.instances.values())
        assert len(set(snapshot.instances.values())) == len(hosts)  # one instance per host, none shared
    else:
        assert dict(snapshot.instances) == {}  # a list or a script names hosts, not instances


def test_close_is_idempotent(case):
    discovery = case.make()
    discovery.find()
    discovery.close()
    discovery.close()


def test_failure_is_a_one_line_discovery_error(failing_case):
    broken = failing_case.make_broken()
    assert broken is not None, f"{failing_case.cls.name} case lacks a broken configuration"
    with pytest.raises(DiscoveryError) as err:
        broken.find()
    broken.close()
    assert str(err.value) and "\n" not in str(err.value)


def test_unknown_option_is_a_config_error_naming_it(case):
    with pytest.raises(ConfigError, match="no option 'bogus'"):
        case.cls.from_options({**case.options, "bogus": "1"})


def test_missing_required_option_is_a_config_error(case):
    required = [o.name for o in case.cls.options if o.required]
    assert required, "every provider needs at least one required option to know what to discover"
    for name in required:
        options = {k: v for k, v in case.options.items() if k != name}
        with pytest.raises(ConfigError, match=repr(name)):
            case.cls.from_options(options)


def test_construction_does_no_io(emulated_case):
    before = len(emulated_case.server.log)
    emulated_case.cls.from_options(emulated_case.options)
    assert len(emulated_case.server.log) == before


def test_registered_under_its_own_name_and_describes_itself(case):
    if case.registered:
        assert registry.load(case.cls.name) is case.cls
    assert case.cls.description
    names = [o.name for o in case.cls.options]
    assert len(names) == len(set(names)) and all(o.help for o in case.cls.options)


#: Reads sent with POST: AWS's Query and JSON APIs (logged by action), GCP's listManagedInstances and token.
_POSTED_READS = re.compile(r"^(Describe|AmazonSQS\.(ReceiveMessage|GetQueueAttributes))|/listManagedInstances$|/token$")


def _write_calls(case: Case) -> int:
    """Requests the case's emulator saw that could change something (0 for providers without one)."""
    if case.server is None:
        return 0
    return sum(1 for method, what in list(case.server.log) if method != "GET" and not _POSTED_READS.search(what))


# Last in the file on purpose: release() may let a cloud go on with a leaving instance, which
# changes the session-wide scene the tests above share.
def test_release_where_nothing_holds_the_host_writes_nothing_and_changes_nothing(case):
    """No provider but AWS has a write path, and AWS has nothing to do without a lifecycle hook holding
    the instance: release() is then a no-op, as far as the emulator (or the next snapshot) can tell."""
    discovery = case.make()
    try:
        snapshot = discovery.find()
        before = _write_calls(case)
        # The driver releases drained hosts; a static list or a script has none, so release its ready ones.
        for host in snapshot.draining or snapshot.ready:
            discovery.release(host, snapshot.instances.get(host))
            discovery.release(host, snapshot.instances.get(host))
        assert discovery.find() == case.expected
        assert _write_calls(case) == before
    finally:
        discovery.close()


def test_release_completes_the_lifecycle_action_of_an_aws_instance_a_hook_holds_exactly_once(aws):
    from tests.emulator.moto_env import clients, hold, make_group

    members = make_group(aws.url, "contract-hook", size=2, instance_type="g4dn.xlarge", cidr="10.74.1.0/24")
    autoscaling, _ = clients(aws.url)
    autoscaling.put_lifecycle_hook(AutoScalingGroupName="contract-hook", LifecycleHookName="drain",
                                   HeartbeatTimeout=600, LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
                                   DefaultResult="CONTINUE")
    leaving = members[1]
    hold(aws, "contract-hook", leaving["id"], "drain")
    discovery = registry.load("aws").from_options(aws_options(aws, "contract-hook"))
    try:
        snapshot = discovery.find()
        assert set(snapshot.draining) == {leaving["ip"]}
        # Heartbeated at once (when the hold began is unknown), but not completed before the job is done with it.
        assert [c["Action"] for c in aws.lifecycle_calls] == ["RecordLifecycleActionHeartbeat"]
        aws.lifecycle_calls.clear()
        discovery.release(leaving["ip"], snapshot.instances[leaving["ip"]])
        discovery.release(leaving["ip"], snapshot.instances[leaving["ip"]])
        discovery.find()
        discovery.find()
    finally:
        discovery.close()
    assert aws.lifecycle_calls == [{"Action": "CompleteLifecycleAction", "AutoScalingGroupName": "contract-hook",
                                    "LifecycleHookName": "drain", "LifecycleActionResult": "CONTINUE",
                                    "InstanceId": leaving["id"]}]
