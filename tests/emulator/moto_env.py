"""AWS for the tests: a moto server behind a counting, fault-injecting proxy.

moto (``ThreadedMotoServer``) emulates Auto Scaling, EC2 and SQS over real
HTTP. :class:`MotoProxy` sits between boto3 and moto so tests can count API
calls by action (``DescribeInstances``, ``AmazonSQS.ReceiveMessage``...),
script throttling or 5xx answers and rewrite answers, which moto cannot do.
States moto has no API for (``Terminating:Wait``, ``Pending``...) are set
through moto's in-process backend.

moto stores lifecycle hooks but never applies them, and answers
``CompleteLifecycleAction`` / ``RecordLifecycleActionHeartbeat`` with 500. The
proxy serves those two itself, like AWS: :func:`hold` puts an instance in
``Terminating:Wait`` for a hook and returns the action's token; the calls
succeed only for an active action (by token, or by instance id and hook name)
and answer ``ValidationError: No active Lifecycle Action found`` otherwise; a
completed action moves the instance on to ``Terminating:Proceed``. Every call
is recorded in :attr:`MotoProxy.lifecycle_calls`.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.emulator.httpfake import FakeCloud, Reply, Request

ACCOUNT = "123456789012"
REGION = "us-east-1"
IMAGE = "ami-12c6146b"  # an image moto knows

THROTTLED = (b'<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>'
             b'<Message>Rate exceeded</Message></Error><RequestId>test</RequestId></ErrorResponse>')
EC2_UNAVAILABLE = (b'<Response><Errors><Error><Code>Unavailable</Code><Message>The server is overloaded'
                   b'</Message></Error></Errors><RequestID>test</RequestID></Response>')
_HOP_HEADERS = {"content-length", "connection", "transfer-encoding", "keep-alive", "date", "server"}


_AUTOSCALING_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
_LIFECYCLE_ACTIONS = ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat")


@dataclass(frozen=True)
class _Action:
    group: str
    hook: str
    instance: str
    token: str


class MotoProxy(FakeCloud):
    """Forwards every request to moto; logs and matches faults by AWS action; serves lifecycle actions."""

    def __init__(self, moto_url: str) -> None:
        super().__init__()
        self._target = urlsplit(moto_url)
        self._rewrites: dict[str, Callable[[bytes], bytes]] = {}
        self._actions: dict[str, _Action] = {}  # token -> active lifecycle action
        self._actions_lock = threading.Lock()
        self.lifecycle_calls: list[dict[str, str]] = []  # form fields of every lifecycle-action call, in order
        for method in ("GET", "POST"):
            self.route(method, "/.*", self._serve)

    def describe(self, request: Request) -> str:
        target = request.headers.get("x-amz-target")
        if target:  # JSON protocols (SQS): "AmazonSQS.ReceiveMessage"
            return target
        fields = parse_qs(request.body.decode(errors="replace")) if request.method == "POST" else {}
        return (fields.get("Action") or [request.query.get("Action", request.path)])[0]

    def reset(self) -> None:
        super().reset()
        with self._actions_lock:
            self._rewrites.clear()
            self.lifecycle_calls.clear()

    def rewrite(self, action: str, change: Callable[[bytes], bytes]) -> None:
        """Pass moto's answers to ``action`` through ``change`` until :meth:`reset`."""
        self._rewrites[action] = change

    def start_action(self, group: str, hook: str, instance: str) -> str:
        """Register an active lifecycle action (see :func:`hold`) and return its token."""
        token = str(uuid.uuid4())
        with self._actions_lock:
            self._actions[token] = _Action(group, hook, instance, token)
        return token

    def _serve(self, request: Request) -> Reply:
        action = self.describe(request)
        if action in _LIFECYCLE_ACTIONS:
            return self._lifecycle_action(action, request.form())
        reply = self._forward(request)
        change = self._rewrites.get(action)
        if change is not None and reply.status == 200 and reply.raw is not None:
            reply.raw = change(reply.raw)
        return reply

    def _lifecycle_action(self, action: str, form: dict[str, str]) -> Reply:
        with self._actions_lock:
            self.lifecycle_calls.append({"Action": action, **{k: v for k, v in form.items() if k not in
                                                              ("Action", "Version")}})
            found = next((a for a in self._actions.values()
                          if a.group == form.get("AutoScalingGroupName") and a.hook == form.get("LifecycleHookName")
                          and (a.token == form.get("LifecycleActionToken") or a.instance == form.get("InstanceId"))),
                         None)
            if found is None:
                message = f"No active Lifecycle Action found with instance ID {form.get('InstanceId', '?')}"
                body = (f'<ErrorResponse xmlns="{_AUTOSCALING_NS}"><Error><Type>Sender</Type><Code>ValidationError'
                        f'</Code><Message>{message}</Message></Error><RequestId>test</RequestId></ErrorResponse>')
                return Reply(400, raw=body.encode())
            if action == "CompleteLifecycleAction":
                del self._actions[found.token]
                set_member(found.group, found.instance, lifecycle="Terminating:Proceed")
        body = (f'<{action}Response xmlns="{_AUTOSCALING_NS}"><{action}Result/><ResponseMetadata><RequestId>test'
                f'</RequestId></ResponseMetadata></{action}Response>')
        return Reply(200, raw=body.encode())

    def _forward(self, request: Request) -> Reply:
        conn = http.client.HTTPConnection(self._target.hostname, self._target.port, timeout=30)
        try:
            target = request.path + (("?" + urlencode(request.query)) if request.query else "")
            headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
            conn.request(request.method, target, body=request.body or None, headers=headers)
            response = conn.getresponse()
            body = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS}
            return Reply(response.status, headers=kept, raw=body)
        finally:
            conn.close()


def clients(endpoint: str) -> tuple[Any, Any]:
    """Test-side boto3 clients (autoscaling, ec2) straight to ``endpoint``, for setting scenes up."""
    import boto3

    kwargs = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                  aws_secret_access_key="testing")
    return boto3.client("autoscaling", **kwargs), boto3.client("ec2", **kwargs)


def make_group(endpoint: str, name: str, *, size: int, instance_type: str = "g4dn.12xlarge",
               cidr: str = "10.20.1.0/24", steps: int = 1) -> list[dict]:
    """Create a launch template and an ASG of ``size`` instances in a fresh subnet of ``cidr``.

    ``steps`` > 1 grows the group in that many scaling actions, so its
    instances land in several EC2 reservations (what DescribeInstances pages
    over). Returns the instances (id, private IP, type) in launch order.
    """
    autoscaling, ec2 = clients(endpoint)
    vpc = ec2.create_vpc(CidrBlock=cidr)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr)["Subnet"]["SubnetId"]
    ec2.create_launch_template(
        LaunchTemplateName=f"lt-{name}", LaunchTemplateData={"ImageId": IMAGE, "InstanceType": instance_type}
    )
    first = size if steps == 1 else 1
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": f"lt-{name}", "Version": "$Latest"},
        MinSize=0, MaxSize=max(size, 1), DesiredCapacity=first, VPCZoneIdentifier=subnet,
    )
    for step in range(2, steps + 1):
        autoscaling.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=max(first, size * step // steps))
    ids = [state.instance.id for state in group_backend(name).instance_states]
    found = {}
    for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=ids):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                found[inst["InstanceId"]] = {"id": inst["InstanceId"], "ip": inst["PrivateIpAddress"],
                                             "type": inst["InstanceType"]}
    return [found[i] for i in ids]


def group_backend(name: str) -> Any:
    """moto's in-process model of an Auto Scaling group."""
    from moto.autoscaling.models import autoscaling_backends

    return autoscaling_backends[ACCOUNT][REGION].autoscaling_groups[name]


def set_member(name: str, instance_id: str, *, lifecycle: str | None = None, health: str | None = None) -> None:
    """Put a member in a lifecycle/health state moto's API cannot reach (Terminating:Wait, Pending...)."""
    for state in group_backend(name).instance_states:
        if state.instance.id == instance_id:
            if lifecycle:
                state.lifecycle_state = lifecycle
            if health:
                state.health_status = health
            return
    raise KeyError(instance_id)


def stop_instance(instance_id: str) -> None:
    """Stop an EC2 instance behind the ASG's back (the ASG still says InService)."""
    from moto.ec2.models import ec2_backends

    ec2_backends[ACCOUNT][REGION].stop_instances([instance_id])


def hold(proxy: MotoProxy, group: str, instance_id: str, hook: str) -> str:
    """Do what AWS does when a termination hook catches an instance: ``Terminating:Wait`` and a token."""
    set_member(group, instance_id, lifecycle="Terminating:Wait")
    return proxy.start_action(group, hook, instance_id)


def sqs_client(endpoint: str) -> Any:
    """Test-side SQS client straight to ``endpoint``."""
    import boto3

    return boto3.client("sqs", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def event(detail_type: str, detail: dict, *, time: str, source: str = "aws.ec2", event_id: str | None = None) -> str:
    """An EventBridge event as the SQS message body AWS delivers."""
    instance = detail.get("instance-id") or detail.get("EC2InstanceId", "")
    return json.dumps({
        "version": "0", "id": event_id or str(uuid.uuid4()), "detail-type": detail_type, "source": source,
        "account": ACCOUNT, "time": time, "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance}"], "detail": detail,
    })
