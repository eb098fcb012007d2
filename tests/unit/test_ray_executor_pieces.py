"""The Ray executor's pure pieces, without a Ray cluster: GPU visibility, settings, errors, verbose logging.

Ray itself is replaced by small fakes here (the real cluster is tests/ray/); none of these start Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import types

import pytest

from cloud_elastic.driver.job.actions import Finish
from cloud_elastic.driver.runtime import driver as driver_module
from cloud_elastic.errors import ConfigError, JobFailed, LaunchError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.ray import ElasticRayExecutor, RayHostDiscovery
from cloud_elastic.ray import executor as executor_module
from cloud_elastic.ray.actor import WorkerActor, cuda_visible_devices
from cloud_elastic.ray.launcher import FunctionPayload, RayLauncher, ray_node_id
from cloud_elastic.worker import settings as worker_settings

pytestmark = pytest.mark.timeout(30)


# ---------------------------------------------------------------- GPUs


def test_each_worker_sees_the_gpu_ray_gave_it_at_its_local_rank():
    node = ["4", "5", "6", "7"]  # the raylet was started with CUDA_VISIBLE_DEVICES=4,5,6,7
    for slot, own in [(0, "6"), (1, "4"), (2, "7"), (3, "5")]:
        visible = cuda_visible_devices(node, [own], slot).split(",")
        assert visible[slot] == own  # cuda:<local rank> is the GPU Ray reserved for this worker
        assert sorted(visible) == node  # and no GPU outside the raylet's, none twice


def test_a_worker_with_two_gpus_has_its_first_at_its_local_rank():
    assert cuda_visible_devices(["0", "1", "2", "3"], ["3", "2"], 1) == "0,2,3,1"


def test_a_slot_past_the_nodes_gpus_is_refused_with_a_reason():
    with pytest.raises(RuntimeError, match="slot 2 cannot be a GPU of its own: Ray shows 2 GPU"):
        cuda_visible_devices(["0", "1"], ["1"], 2)


def _fake_ray(monkeypatch: pytest.MonkeyPatch, *, node_gpus: list[str] | None, gpu_ids: list) -> None:
    ray = types.ModuleType("ray")
    ray.get_gpu_ids = lambda: list(gpu_ids)
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_node_id=lambda: "n1")
    ray.nodes = lambda: [{"NodeID": "n1", "Resources": {"GPU": 4.0}}]
    private = types.ModuleType("ray._private")
    worker = types.ModuleType("ray._private.worker")
    worker.global_worker = types.SimpleNamespace(original_visible_accelerator_ids={"GPU": node_gpus})
    for name, module in (("ray", ray), ("ray._private", private), ("ray._private.worker", worker)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the actor writes its process's environment
    monkeypatch.setattr(worker_settings, "_taken", [])


@pytest.mark.parametrize(("node_gpus", "expected"), [(["4", "5", "6", "7"], "4,5,6,7"), (None, "0,2,1,3")])
def test_the_actor_shows_its_training_function_the_gpu_ray_assigned(monkeypatch, node_gpus, expected):
    # Ray gave the slot-2 worker GPU 6 of a raylet on 4..7, or GPU 1 of a raylet on all four.
    _fake_ray(monkeypatch, node_gpus=node_gpus, gpu_ids=[6] if node_gpus else [1])
    reply = WorkerActor().run_function({worker_settings.SLOT_ENV: "2"}, "secret",
                                       lambda: os.environ["CUDA_VISIBLE_DEVICES"], (), {}, True)
    assert reply["value"] == expected


class _Context:
    """The worker library's context of a function that joined a round as rank 1; records what it told the driver."""

    def __init__(self, elastic_entered: bool) -> None:
        self.elastic_entered = elastic_entered
        self.info = types.SimpleNamespace(rank=1)
        self._uncaught: BaseException | None = None
        self.told: list[str] = []

    def _report_script_end(self) -> None:
        self.told.append(f"script ended: {self._uncaught!r}")

    def close(self) -> None:
        self.told.append("closed")


def _run_in_actor(monkeypatch, fn, elastic_entered: bool = False) -> tuple[_Context, dict]:
    from cloud_elastic.worker import context

    _fake_ray(monkeypatch, node_gpus=None, gpu_ids=[])
    ctx = _Context(elastic_entered)
    monkeypatch.setattr(context, "_CONTEXT", ctx)
    return ctx, WorkerActor().run_function({}, "secret", fn, (), {}, False)


def test_a_fixed_size_function_tells_the_driver_it_ended_before_its_result_goes_back(monkeypatch):
    # Without it the driver, which kills the actor, takes the returned function for a worker lost mid-training.
    ctx, reply = _run_in_actor(monkeypatch, lambda: "trained")
    assert reply == {"kind": "result", "rank": 1, "value": "trained"}
    # Not closed: heartbeats go on while Ray serialises the value (86730ce; the launcher kills the actor after).
    assert ctx.told == ["script ended: None"]


def test_a_fixed_size_function_that_raised_tells_the_driver_its_error(monkeypatch):
    def train():
        raise KeyError("label")

    with pytest.raises(KeyError):
        _run_in_actor(monkeypatch, train)
    from cloud_elastic.worker import context

    assert context._CONTEXT.told == ["script ended: KeyError('label')"]


def test_an_elastic_function_reports_its_end_through_elastic_run_not_as_a_script(monkeypatch):
    ctx, reply = _run_in_actor(monkeypatch, lambda: "trained", elastic_entered=True)
    assert reply["value"] == "trained" and ctx.told == []


def test_gpus_per_slot_is_whole_gpus_and_defaults_to_one():
    settings = ElasticRayExecutor.create_settings()
    assert ElasticRayExecutor(settings, use_gpu=True, gpus_per_slot=None).gpus_per_slot == 1
    for share in (0.5, 1.5, 0):
        with pytest.raises(ConfigError, match="gpus_per_slot must be a whole number >= 1"):
            ElasticRayExecutor(settings, use_gpu=True, gpus_per_slot=share)
    with pytest.raises(ConfigError, match="gpus_per_slot must be a whole number >= 1"):
        RayHostDiscovery.from_options({"use_gpu": "true", "gpus_per_slot": "0.5"})


class _Ray:
    """What RayLauncher.launch calls of Ray: records each actor's options and the environment it is given."""

    def __init__(self, nodes: list[dict]) -> None:
        self._nodes = nodes
        self.started: list[tuple[dict, dict]] = []  # (actor options, the worker's environment)
        self.exceptions = types.SimpleNamespace(RayTaskError=type("RayTaskError", (Exception,), {}),
                                                RayError=Exception)

    def nodes(self) -> list[dict]:
        return self._nodes

    def put(self, value):
        return value

    def remote(self, _cls):
        ray = self

        class Actor:
            def __init__(self, options: dict) -> None:
                starts = lambda env, *rest: ray.started.append((options, env))  # noqa: E731
                self.run_function = self.run_command = types.SimpleNamespace(remote=starts)

        return types.SimpleNamespace(options=lambda **options: types.SimpleNamespace(remote=lambda: Actor(options)))

    def get(self, _ref):
        return {"kind": "exit", "code": 0}

    def kill(self, _actor, no_restart=True) -> None:
        pass


_NODE = "ab" * 28  # a node id


def _launch(monkeypatch, launcher, host: str = _NODE, env: dict | None = None, nodes: list[dict] | None = None):
    """Launch one worker on ``host`` through a fake Ray; return (actor options, the worker's environment)."""
    from cloud_elastic.driver.launch.api import WorkerSpec
    from cloud_elastic.ray import launcher as launcher_module

    ray = _Ray(nodes or [])
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.NodeAffinitySchedulingStrategy = lambda node_id, soft: ("node", node_id, soft)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", strategies)
    monkeypatch.setattr(launcher_module, "require_ray", lambda: ray)
    worker = launcher.launch(WorkerSpec("w1", host, 0, ("python", "train.py"), env or {}, "S" * 64, "/"), print)
    worker._thread.join(5)
    return ray.started[0]


@pytest.mark.parametrize("payload", [FunctionPayload(print), None], ids=["function", "command"])
def test_a_worker_without_use_gpu_sees_no_gpu_unless_the_job_shows_it_some(monkeypatch, payload):
    # Ray 2.60 leaves an actor with num_gpus=0 every GPU of its node; the worker would then pick NCCL and
    # cuda:<slot>, on GPUs Ray reserved for others.
    options, env = _launch(monkeypatch, RayLauncher(payload))
    assert options["num_gpus"] == 0 and env["CUDA_VISIBLE_DEVICES"] == ""
    _, env = _launch(monkeypatch, RayLauncher(payload), env={"CUDA_VISIBLE_DEVICES": "3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the user's own choice (env_vars) stands
    options, env = _launch(monkeypatch, RayLauncher(payload, use_gpu=True))
    assert options["num_gpus"] == 1 and "CUDA_VISIBLE_DEVICES" not in env  # the actor sets Ray's own GPUs


_NODES = [{"NodeID": "n-dead", "Alive": False, "NodeManagerAddress": "10.0.0.5", "NodeManagerHostname": "gpu-5"},
          {"NodeID": "n-5", "Alive": True, "NodeManagerAddress": "10.0.0.5", "NodeManagerHostname": "gpu-5"},
          {"NodeID": "n-6a", "Alive": True, "NodeManagerAddress": "10.0.0.6", "NodeManagerHostname": "a"},
          {"NodeID": "n-6b", "Alive": True, "NodeManagerAddress": "10.0.0.6", "NodeManagerHostname": "b"}]


def test_a_host_named_by_ip_or_hostname_is_pinned_to_the_alive_node_of_that_name(monkeypatch):
    for host in ("10.0.0.5", "gpu-5", "n-5"):
        options, _ = _launch(monkeypatch, RayLauncher(), host, nodes=_NODES)
        assert options["scheduling_strategy"] == ("node", "n-5", False)
    assert ray_node_id("b", _NODES) == "n-6b" and ray_node_id("10.0.0.9", _NODES) is None
    with pytest.raises(ConfigError, match="host '10.0.0.6' names 2 Ray nodes; name them by node id"):
        ray_node_id("10.0.0.6", _NODES)
    with pytest.raises(LaunchError, match="host '10.0.0.9' is no alive node of this Ray cluster"):
        _launch(monkeypatch, RayLauncher(), "10.0.0.9", nodes=_NODES)


class _Hosts(HostDiscovery):
    name = "mine"

    def __init__(self, *hosts: str) -> None:
        self.hosts = hosts

    def find(self) -> DiscoveredHosts:
        return DiscoveredHosts(ready=dict.fromkeys(self.hosts, 1))

    @classmethod
    def from_options(cls, options, *, slots_per_host=None):
        return cls()


def test_an_override_discovery_naming_no_ray_node_is_refused_at_once_not_after_the_start_timeout(monkeypatch):
    from cloud_elastic.ray import launcher as launcher_module

    ray = types.SimpleNamespace(is_initialized=lambda: True, nodes=lambda: _NODES,
                                util=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
    monkeypatch.setattr(executor_module, "require_ray", lambda: ray)
    monkeypatch.setattr(launcher_module, "require_ray", lambda: ray)
    monkeypatch.setattr(driver_module, "Driver", None)  # must not start
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(), override_discovery=_Hosts("h1", "h2"))
    executor.start()
    with pytest.raises(ConfigError, match=r"override_discovery: host 'h1' is no alive node .* \(and 1 more\)"):
        executor.run(print)


# ---------------------------------------------------------------- settings


def test_horovods_names_set_the_same_settings():
    config = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=6, timeout_s=30).job_config(
        ("<ray actor>", "train"), "127.0.0.1")
    assert (config.min_np, config.max_np, config.start_timeout_s) == (2, 6, 30)
    with pytest.raises(ConfigError, match="min_np=3 and min_num_proc=2 name the same setting"):
        ElasticRayExecutor.create_settings(min_np=3, min_num_proc=2)


@pytest.mark.parametrize("name", ["nics", "ssh_identity_file"])
def test_horovods_ssh_and_nic_settings_are_refused_with_a_reason(name):
    with pytest.raises(ConfigError, match=rf"create_settings\({name}=...\) is Horovod's and has no use here"):
        ElasticRayExecutor.create_settings(**{name: "x"})


def test_an_unknown_setting_is_named():
    with pytest.raises(ConfigError, match="unknown setting.s. events_file"):
        ElasticRayExecutor.create_settings(events_file="e.jsonl")


def test_override_discovery_takes_horovods_true_or_a_discovery():
    settings = ElasticRayExecutor.create_settings()
    assert isinstance(ElasticRayExecutor(settings, override_discovery=True)._discovery, RayHostDiscovery)
    with pytest.raises(ConfigError, match="override_discovery=False: pass the HostDiscovery"):
        ElasticRayExecutor(settings, override_discovery=False)


# ---------------------------------------------------------------- run(): errors and verbose


def _run(monkeypatch, settings, reason: str | None, errors=(), log_line: str = ""):
    """Run an executor whose driver logs ``log_line`` at debug and ends with ``reason`` (None: success) after
    the training functions of ``errors`` (worker id, exception) raised."""

    class FakeDriver:
        def __init__(self, config, discovery, *, launcher):
            self.launcher = launcher

        def run(self):
            for worker_id, exc in errors:
                self.launcher._record_error(worker_id, exc)
            if log_line:
                logging.getLogger("cloud_elastic.driver.runtime.driver").debug(log_line)
            return Finish(reason is None, reason or "done", 0 if reason is None else 1)

    fake = types.SimpleNamespace(is_initialized=lambda: True,
                                 util=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
    monkeypatch.setattr(executor_module, "require_ray", lambda: fake)
    monkeypatch.setattr(driver_module, "Driver", FakeDriver)
    executor = ElasticRayExecutor(settings, override_discovery=RayHostDiscovery(address=None))
    executor.start()
    return executor.run(print)


def test_a_failed_job_raises_the_drivers_reason_not_an_error_it_recovered_from(monkeypatch):
    oom = MemoryError("CUDA out of memory at step 10")
    reason = "round formation failed 5 times in a row over 600s (--elastic-timeout 600s)"
    with pytest.raises(JobFailed) as failed:
        _run(monkeypatch, ElasticRayExecutor.create_settings(), reason, [("n1[0]#1", oom)])
    assert failed.value.reason == reason
    assert failed.value.__cause__ is None


def test_the_training_error_of_the_worker_the_driver_names_is_the_cause(monkeypatch):
    first, last = ValueError("bad batch on rank 0"), KeyError("rank 1")
    reason = "all workers failed; last: worker n1[1]#12 (rank 1 on n1) exited with code 1"
    errors = [("n1[0]#1", first), ("n1[1]#1", ValueError("older")), ("n1[1]#12", last)]
    with pytest.raises(JobFailed, match=r"all workers failed; last: worker n1\[1\]#12") as failed:
        _run(monkeypatch, ElasticRayExecutor.create_settings(), reason, errors)
    assert failed.value.__cause__ is last


@contextlib.contextmanager
def _no_logging_configured():
    """No handler on or above cloud_elastic's logger, as in a script that never configured logging. Undone
    within the test: pytest's own capture handlers, added around the test's body, must be in place after it."""
    logger = logging.getLogger("cloud_elastic")
    saved = logger.handlers, logger.propagate, logger.level
    logger.handlers, logger.propagate = [], False
    logger.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])


def test_verbose_shows_the_drivers_debug_lines_on_stderr_for_the_run(monkeypatch, capsys):
    with _no_logging_configured():
        _run(monkeypatch, ElasticRayExecutor.create_settings(verbose=True), None, log_line="round 1: 2 workers")
        _run(monkeypatch, ElasticRayExecutor.create_settings(), None, log_line="round 2: 3 workers")
    err = capsys.readouterr().err
    assert "cloud-elastic: round 1: 2 workers" in err
    assert "round 2" not in err  # verbose was for that run only
