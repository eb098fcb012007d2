"""AWS for the tests: a moto server behind a counting, fault-injecting proxy.

moto (``ThreadedMotoServer``) emulates Auto Scaling and EC2 over real HTTP.
:class:`MotoProxy` sits between boto3 and moto so tests can count API calls
by action (``DescribeInstances``...) and script throttling or 5xx answers,
which moto cannot do. States moto has no API for (``Terminating:Wait``,
``Pending``...) are set through moto's in-process backend.
"""

from __future__ import annotations

import http.client
from typing import Any
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


class MotoProxy(FakeCloud):
    """Forwards every request to moto; logs and matches faults by AWS ``Action``."""

    def __init__(self, moto_url: str) -> None:
        super().__init__()
        self._target = urlsplit(moto_url)
        for method in ("GET", "POST"):
            self.route(method, "/.*", self._forward)

    def describe(self, request: Request) -> str:
        fields = parse_qs(request.body.decode(errors="replace")) if request.method == "POST" else {}
        return (fields.get("Action") or [request.query.get("Action", request.path)])[0]

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
