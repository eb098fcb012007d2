"""The defaults give workers whose torch can use their GPUs, and groups one job can mix.

PyPI's torch (``worker_torch_index = ""``) is a CUDA 13 build: it needs an
NVIDIA driver R580 or newer and a Turing or newer GPU (docs/terraform.md). A
default GPU older than that, or a default image with an older driver and no
index of a torch for its CUDA, gives workers on which torch sees no GPU. The
groups of one job must hold GPUs of the same memory and features (a job sized
for 24 GiB fails on a 16 GiB GPU; bf16 is not on T4 or V100), as the AWS
module's ``gpu_instance_types`` says.

The GPU facts below are the clouds' published ones, for the names the
defaults use; a default naming a GPU missing here fails until it is added.
"""

from __future__ import annotations

import re

import pytest

from .hcl import TERRAFORM_DIR, Module, Tree, parse, reference

pytestmark = [pytest.mark.terraform, pytest.mark.timeout(60)]

TURING = 7.5  # the oldest compute capability CUDA 13 supports

# IBM Cloud VPC GPU profiles are <family>-<vCPU>x<GiB>x<count><gpu>, e.g. gx3-16x80x1l4.
IBM_PROFILE = re.compile(r"^gx\d+d?-\d+x\d+x(\d+)([a-z][a-z0-9]*)$")
IBM_GPUS = {"v100": 7.0, "l4": 8.9, "l40s": 8.9, "a100p": 8.0, "h100": 9.0, "h200": 9.0}

# AWS instance families: (GPU, GiB per GPU, bf16, compute capability). Sizes up to 16xlarge hold one GPU.
AWS_GPUS = {
    "g4dn": ("T4", 16, False, 7.5),
    "g5": ("A10G", 24, True, 8.6),
    "g6": ("L4", 24, True, 8.9),
    "gr6": ("L4", 24, True, 8.9),
    "g6e": ("L40S", 48, True, 8.9),
    "p3": ("V100", 16, False, 7.0),
}
AWS_ONE_GPU_SIZES = {"xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"}

MULTI = {cloud: TERRAFORM_DIR / "examples" / f"{cloud}-multi-source" for cloud in ("aws", "gcp")}


def _ibm_gpu(profile: str) -> tuple[int, str]:
    match = IBM_PROFILE.match(profile)
    assert match, f"{profile!r} is not an IBM GPU profile name"
    count, gpu = int(match.group(1)), match.group(2)
    assert gpu in IBM_GPUS, f"{profile!r}: GPU {gpu!r} unknown here; add it to IBM_GPUS"
    return count, gpu


def test_ibm_default_gpu_profile_is_turing_or_newer(tree: Tree):
    ibm = tree.module("ibm")
    profile = ibm.variable_default("gpu_profile")
    count, gpu = _ibm_gpu(profile)
    assert IBM_GPUS[gpu] >= TURING, f"default gpu_profile {profile} ({gpu}) is older than Turing: PyPI's torch cannot use it"
    assert count == ibm.variable_default("gpus_per_instance")
    assert f"`{profile}`" in tree.docs, "docs/terraform.md must name the IBM module's default gpu_profile"
    assert "v100" not in (TERRAFORM_DIR / "examples" / "ibm" / "main.tf").read_text().lower()


def test_ibm_readme_example_gpu_profile_is_turing_or_newer_and_matches_its_gpu_count(tree: Tree):
    snippet = re.search(r"```hcl\n(.*?)```", tree.readme("ibm"), re.S).group(1)
    (call,) = [c for entry in parse(snippet)["module"] for c in entry.values()]
    count, gpu = _ibm_gpu(call["gpu_profile"])
    assert IBM_GPUS[gpu] >= TURING, f"README example gpu_profile {call['gpu_profile']} is older than Turing"
    assert count == call["gpus_per_instance"]


def _image_cuda_major(image: str) -> int:
    match = re.search(r"-cu(1\d)\d+$", image)
    assert match, f"cannot tell the CUDA of image {image!r}"
    return int(match.group(1))


def test_gcp_default_image_gets_a_torch_built_for_its_driver(tree: Tree):
    """The Deep Learning VM family's CUDA names its driver: a CUDA 12 image has a driver older than R580."""
    gcp = tree.module("gcp")
    major = _image_cuda_major(gcp.variable_default("gpu_image"))
    index = gcp.variable_default("worker_torch_index")
    if major >= 13:
        return
    match = re.fullmatch(r"https://download\.pytorch\.org/whl/cu(\d\d)\d", index)
    assert match, f"gpu_image is a CUDA {major} image, but worker_torch_index {index!r} is no torch index for CUDA {major}"
    assert int(match.group(1)) == major


@pytest.mark.parametrize("example", ["gcp", "gcp-multi-source"])
def test_gcp_examples_pass_worker_torch_index_with_the_modules_default(example: str):
    root = Module.load(TERRAFORM_DIR / "examples" / example)
    (call,) = [c for c in root.module_calls.values() if c.get("source") == "../../modules/gcp"]
    assert reference(call.get("worker_torch_index")) == "var.worker_torch_index"
    module = Module.load(TERRAFORM_DIR / "modules" / "gcp")
    assert root.variable_default("worker_torch_index") == module.variable_default("worker_torch_index")


def test_gcp_multi_source_fallback_boots_the_spot_workers_image_and_bootstrap():
    """The on-demand template takes the module's worker metadata (its torch index) so it needs the same image."""
    m = Module.load(MULTI["gcp"])
    template = m.resource("google_compute_instance_template", "on_demand")
    assert template["metadata"] == "${module.cloud_elastic.worker_metadata}"
    module = Module.load(TERRAFORM_DIR / "modules" / "gcp")
    assert m.variable_default("gpu_image") == module.variable_default("gpu_image")


def _aws_gpu(instance_type: str) -> tuple[str, int, bool, float]:
    family, _, size = instance_type.partition(".")
    assert family in AWS_GPUS, f"{instance_type}: family {family!r} unknown here; add it to AWS_GPUS"
    assert size in AWS_ONE_GPU_SIZES, f"{instance_type}: not a one-GPU size"
    return AWS_GPUS[family]


def test_aws_multi_source_groups_hold_the_same_gpu_memory_and_features():
    m = Module.load(MULTI["aws"])
    spot_a, spot_b = m.variable_default("spot_a_instance_types"), m.variable_default("spot_b_instance_types")
    fallback = m.variable_default("on_demand_instance_type")
    module_types = Module.load(TERRAFORM_DIR / "modules" / "aws").variable_default("gpu_instance_types")
    assert not set(spot_a) & set(spot_b), "spot-b must offer other pools than spot-a"
    kinds = {t: _aws_gpu(t) for t in [*spot_a, *spot_b, fallback, *module_types]}
    assert len({(mem, bf16) for _, mem, bf16, _ in kinds.values()}) == 1, \
        f"the groups of one job mix GPU memory or bf16: {kinds}"
    assert all(cc >= TURING for *_, cc in kinds.values()), f"a default type is older than Turing: {kinds}"
