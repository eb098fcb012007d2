"""Conventions every Terraform directory follows, as checks returning problems.

* every variable has a type, a description, and a validation unless no bad
  value exists (a bool) or it is handed unchanged to a module input that
  validates it;
* Terraform and every provider have a version range with an upper bound,
  and there is no backend (or cloud) block;
* each cloud module's README shows a module call that matches its variables
  and outputs, and each example root calls its module the same way.
"""

from __future__ import annotations

import re

from .hcl import Module, Tree, parse, reference
from .properties import Problems


def _child(module: Module, call: dict) -> Module | None:
    source = call.get("source", "")
    if not source.startswith("."):
        return None
    return Module.load((module.path / source).resolve())


def _validated(module: Module, name: str) -> bool:
    """Whether variable ``name`` is checked here or by a module it is passed to unchanged."""
    conditions = [str(v.get("condition", "")) for v in module.variables.get(name, {}).get("validation", [])]
    if any(f"var.{name}" in c for c in conditions):
        return True
    for call in module.module_calls.values():
        for arg, value in call.items():
            if reference(value) == f"var.{name}":
                child = _child(module, call)
                if child is not None and arg in child.variables and _validated(child, arg):
                    return True
    return False


def variable_problems(module: Module) -> list[str]:
    p = Problems()
    for name, var in module.variables.items():
        p.expect(var.get("type"), f"{module.path.name}: variable {name} has no type")
        p.expect(str(var.get("description", "")).strip(), f"{module.path.name}: variable {name} has no description")
        if var.get("type") != "bool":
            p.expect(_validated(module, name), f"{module.path.name}: variable {name} has no validation (here or in the module it feeds)")
    return p


def version_problems(module: Module) -> list[str]:
    p = Problems()
    blocks = module.terraform_blocks
    if not p.expect(blocks, f"{module.path.name}: no terraform block"):
        return p
    for tf in blocks:
        p.expect("backend" not in tf and "cloud" not in tf, f"{module.path.name}: no backend or cloud block allowed")
    required = next((tf["required_version"] for tf in blocks if "required_version" in tf), "")
    p.expect(re.search(r"<", required), f"{module.path.name}: required_version needs an upper bound, got {required!r}")
    for tf in blocks:
        for entry in tf.get("required_providers", []):
            for name, spec in entry.items():
                version = spec.get("version", "") if isinstance(spec, dict) else ""
                p.expect(isinstance(spec, dict) and spec.get("source"), f"{module.path.name}: provider {name} needs a source")
                p.expect(re.search(r"<|~>", version), f"{module.path.name}: provider {name} needs an upper version bound, got {version!r}")
    return p


def call_problems(module: Module, call: dict, where: str) -> list[str]:
    """A module call's arguments must be the module's variables, and cover the required ones."""
    p = Problems()
    meta = {"source", "version", "providers", "depends_on", "count", "for_each"}
    args = set(call) - meta
    unknown = args - set(module.variables)
    p.expect(not unknown, f"{where}: arguments the module does not have: {sorted(unknown)}")
    required = {n for n, v in module.variables.items() if "default" not in v}
    p.expect(required <= args, f"{where}: required variables not given: {sorted(required - args)}")
    return p


def _output_refs(text: str, call_name: str) -> set[str]:
    return set(re.findall(rf"module\.{re.escape(call_name)}\.(\w+)", text))


def readme_problems(tree: Tree, cloud: str) -> list[str]:
    p = Problems()
    module, readme = tree.module(cloud), tree.readme(cloud)
    snippets = re.findall(r"```(?:hcl|terraform)\n(.*?)```", readme, re.S)
    calls = {}
    for snippet in snippets:
        parsed = parse(snippet)
        for entry in parsed.get("module", []):
            calls.update({n: c for n, c in entry.items() if str(c.get("source", "")).rstrip("/").endswith(f"modules/{cloud}")})
    if not p.expect(calls, f"modules/{cloud}/README.md needs an hcl example calling the module"):
        return p
    for name, call in calls.items():
        p.extend(call_problems(module, call, f"README example module {name!r}"))
        refs = _output_refs(readme, name)
        p.expect("cli_command" in refs, f"README example must show module.{name}.cli_command")
        p.expect(refs <= set(module.outputs), f"README uses outputs the module lacks: {sorted(refs - set(module.outputs))}")
    for output in module.outputs:
        p.expect(f"`{output}`" in readme, f"README must document output `{output}`")
    return p


def example_problems(tree: Tree, cloud: str) -> list[str]:
    p = Problems()
    module, example = tree.module(cloud), tree.example(cloud)
    calls = {n: c for n, c in example.module_calls.items() if str(c.get("source")) == f"../../modules/{cloud}"}
    if not p.expect(len(calls) == 1, f"examples/{cloud} must call ../../modules/{cloud} once"):
        return p
    (name, call), = calls.items()
    p.extend(call_problems(module, call, f"examples/{cloud}"))
    refs = set()
    for output in example.outputs.values():
        refs |= _output_refs(str(output.get("value")), name)
    p.expect("cli_command" in refs, f"examples/{cloud} must output the module's cli_command")
    p.expect(refs <= set(module.outputs), f"examples/{cloud} uses outputs the module lacks: {sorted(refs - set(module.outputs))}")
    return p
