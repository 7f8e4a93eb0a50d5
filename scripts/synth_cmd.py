"""`fleetcast synth summary`: what `cdk synth` produced for a config, checked against that config.

Reads the cloud assembly's manifest and templates (no CDK import, instant) and
prints the stacks, regions, pools (instance type, GPU, capacity, precision,
backend) and consumers, including those that got no stack and why. An assembly
that does not match the config (a stale cdk.out) is an error.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.contract.errors import UserError

if TYPE_CHECKING:
    from fleetcast.config import FleetConfig

STACK_ARTIFACT = "aws:cloudformation:stack"
MAKE_DEFAULT_CONFIG = "config/fleet.yaml"  # the Makefile's CONFIG default, relative to where make runs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("synth", help="summarize a synthesized cloud assembly (after `make synth`)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    summary = actions.add_parser("summary", help="stacks, regions, pools, precision and consumers of a cdk.out")
    summary.add_argument("--config", default="config/fleet.yaml", help="fleet config the assembly was built from")
    summary.add_argument("--out", default="cdk.out", help="cloud assembly directory (default: cdk.out)")
    summary.set_defaults(handler=_summary)


def read_stacks(out: Path) -> dict[str, dict[str, Any]]:
    """Stack artifacts of a cloud assembly: name -> environment and resource count."""
    manifest_path = out / "manifest.json"
    if not manifest_path.exists():
        raise UserError(f"{manifest_path} not found: run `make synth` (or `npx cdk synth`) first")
    manifest = json.loads(manifest_path.read_text())
    stacks = {}
    for name, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != STACK_ARTIFACT:
            continue
        template_file = artifact.get("properties", {}).get("templateFile", f"{name}.template.json")
        text = (out / template_file).read_text()
        stacks[name] = {
            "environment": artifact.get("environment", "?"),
            "resources": len(json.loads(text).get("Resources", {})),
            "template_text": text,  # read once; the config check searches it
        }
    return stacks


def summarize(cfg: FleetConfig, stacks: dict[str, dict[str, Any]], out: Path) -> tuple[list[str], list[str]]:
    """Summary lines, and problems (stacks the config implies but the assembly lacks, or the reverse)."""
    from fleetcast.config import catalog
    from fleetcast.contract.instance_env import Var
    from fleetcast.contract.names import (
        config_parameter_description,
        consumer_stack_name,
        expected_stacks,
        provider_stack_name,
        skip_reason,
    )

    lines = [f"Fleet {cfg.name}: config digest {cfg.digest()[:12]}, egress {cfg.network.egress.value}, "
             f"{'model' if len(cfg.models) == 1 else 'models'} {', '.join(f'{m.id}@{m.revision}' for m in cfg.models)}, "
             f"TensorRT-LLM {cfg.engine.tensorrt_llm_version}"]
    lines.append(f"Stacks in {out}:")
    width = max((len(n) for n in stacks), default=10)
    env_width = max((len(i["environment"]) for i in stacks.values()), default=10)
    for name, info in stacks.items():
        lines.append(f"  {name:<{width}}  {info['environment']:<{env_width}}  {info['resources']} resources")

    from fleetcast.config.memory import plan_pool
    from fleetcast.contract.serving import GIB

    instances = catalog.instance_catalog()
    lines.append("Regions:")
    for region in cfg.regions:
        listener = "TLS" if region.region in cfg.network.tls_certificate_arns else "TCP"
        vpc = getattr(region.vpc, "vpc_id", None) or f"new {region.vpc.cidr}"
        azs = ", ".join(f"{az.name} ({az.id})" for az in region.availability_zones)
        lines.append(f"  {region.region}  [{provider_stack_name(cfg.name, region.region)}]")
        lines.append(f"    VPC {vpc}; AZs {azs}; listener {listener}:{cfg.engine.port}; AMI {region.ami.id}")
        cross = ", ".join(region.allowed_regions) or "none"
        lines.append(f"    principals {', '.join(region.allowed_principals)}; cross-region from {cross}")
        for pool in region.pools:
            gpu = instances[pool.instance_type].gpu.name if pool.instance_type in instances else "?"
            c = pool.capacity
            served = cfg.served_by(pool)
            if len(served) == 1 and served[0].copies == 1:
                engine = served[0].engine
                lines.append(
                    f"    pool {pool.name}: {pool.instance_type} ({gpu}), capacity {c.describe()}, "
                    f"precision {engine.precision.value}, backend {engine.backend.value}, "
                    f"batch {engine.max_batch_size}, warm pool {pool.warm_pool.size}"
                )
                continue
            lines.append(f"    pool {pool.name}: {pool.instance_type} ({gpu}), capacity {c.describe()}, "
                         f"warm pool {pool.warm_pool.size}; each instance serves:")
            plan = plan_pool(cfg, pool)
            shares = {p.model_id: p.kv_bytes for p in plan.processes} if plan is not None else {}
            for s in served:
                share = shares.get(s.model.id)
                kv = f", KV {s.kv_cache_bytes / GIB:.2f} GiB each" if s.kv_cache_bytes is not None else \
                    f", KV share about {share / GIB:.2f} GiB each (planned on the instance)" if share else ""
                lines.append(f"      {s.model.id} x{s.copies}: precision {s.engine.precision.value}, backend "
                             f"{s.engine.backend.value}, batch {s.engine.max_batch_size}{kv}")

    from fleetcast.config.kv_room import kv_room_warnings

    lines += [f"  warning: {w.dotted}: {w.message}" for w in kv_room_warnings(cfg)]
    lines.append("Consumers:")
    if not cfg.consumers:
        lines.append("  none")
    for consumer in cfg.consumers:
        route = f"{consumer.region} -> {consumer.service_region}" + (" (cross-region)" if consumer.cross_region else "")
        reason = skip_reason(consumer)
        where = f"skipped: {reason}" if reason else f"[{consumer_stack_name(cfg.name, consumer.name)}]"
        lines.append(f"  {consumer.name} ({consumer.account}, {route}): {where}")

    expected = expected_stacks(cfg)
    problems = [f"stack {n} is missing from {out}" for n in expected if n not in stacks]
    problems += [f"stack {n} in {out} is not built from this config" for n in stacks if n not in expected]
    # Launch templates carry their pool's instance digest and the config parameter names the
    # whole config's digest: a provider template without all of them came from another config.
    for region in cfg.regions:
        provider = stacks.get(provider_stack_name(cfg.name, region.region))
        marks = [config_parameter_description(cfg)] + [
            f"{Var.CONFIG_DIGEST.value}={cfg.instance_digest(region.region, pool.name)}" for pool in region.pools]
        if provider and not all(mark in provider["template_text"] for mark in marks):
            problems.append(f"stack {provider_stack_name(cfg.name, region.region)} was synthesized from a different config")
    return lines, problems


def _summary(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config

    cfg = load_config(args.config)
    out = Path(args.out)
    if not (out / "manifest.json").exists():
        raise UserError(f"{out / 'manifest.json'} not found: run `{synth_hint(args.config)}` first")
    lines, problems = summarize(cfg, read_stacks(out), out)
    # A summary of a config the assembly was not built from would describe stacks that do not exist.
    if problems:
        raise UserError(f"{out} does not match {args.config}: " + "; ".join(problems)
                        + f" (run `{synth_hint(args.config)}` again)")
    print("\n".join(lines))
    return 0


def synth_hint(config: str) -> str:
    """The make command that synthesizes `config` (the Makefile's CONFIG defaults to config/fleet.yaml)."""
    if Path(config).resolve() == Path(MAKE_DEFAULT_CONFIG).resolve():
        return "make synth"
    return f"make synth CONFIG={shlex.quote(config)}"
