"""`fleetcast config init`: a commented, minimal fleet config that validates, from a few answers.

Everything not asked keeps its model default (the reference lists them); what the answers
cannot know (consumer VPC/subnet ids and CIDRs, the AZ name-to-ID mapping of your account, the
AMI to pin) is written with a `# REPLACE:` comment, as the shipped example does, and as a value that
`config validate --deploy` refuses until it is replaced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import catalog
from .rules import az_id_prefix

# Models `init` knows how to start with: each one's length limits and serving flow.
# parameters_b (the weights, in billions) feeds the GPU memory check a pool of several models needs.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-xl": {"family": "gpt2", "source": "openai-community/gpt2-xl", "context_length": 1024,
                "max_input_len": 768, "max_output_len": 256, "backend": "tensorrt", "precision": "int8_wo",
                "parameters_b": 1.56},
    "qwen2.5-0.5b-instruct": {"family": "qwen2", "source": "Qwen/Qwen2.5-0.5B-Instruct", "context_length": 32768,
                              "max_input_len": 4096, "max_output_len": 1024, "backend": "pytorch",
                              "precision": "bf16", "parameters_b": 0.49},
}
DEFAULT_MODEL = "gpt2-xl"
# What init writes where it cannot know a value is a placeholder `config validate --deploy` recognizes by rule
# (fleetcast/config/readiness.py): resource ids of zeros, and consumer ranges from the blocks reserved for
# documentation (RFC 5737), which no consumer network uses.
PLACEHOLDER_CIDRS = ("198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24")
# Preferred instance per region: the first family of this list the region offers.
INSTANCE_CHOICES = (("g6e", "g6e.xlarge"), ("g6", "g6.xlarge"), ("g5", "g5.xlarge"))


@dataclass(frozen=True)
class ConsumerAnswer:
    name: str
    account: str
    region: str | None = None


@dataclass(frozen=True)
class InitAnswers:
    account: str
    regions: tuple[str, ...]
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    consumers: tuple[ConsumerAnswer, ...] = field(default_factory=tuple)
    name: str = "fleetcast"


def check_account(value: str, what: str) -> str:
    value = value.strip()
    if not re.fullmatch(r"[0-9]{12}", value, re.ASCII):
        raise ValueError(f"{what}: {value!r} is not an AWS account id (12 digits, e.g. 111122223333)")
    return value


def check_region(value: str, what: str) -> str:
    value = value.strip()
    if not re.fullmatch(r"[a-z]{2}(-gov)?-[a-z]+-[0-9]", value, re.ASCII):
        raise ValueError(f"{what}: {value!r} is not an AWS region code such as ap-northeast-2")
    return value


def parse_consumer(value: str) -> ConsumerAnswer:
    """NAME=ACCOUNT or NAME=ACCOUNT@REGION."""
    match = re.fullmatch(r"([a-z][a-z0-9-]{0,30}[a-z0-9])=(\S+?)(?:@(\S+))?", value.strip(), re.ASCII)
    if not match:
        raise ValueError(f"--consumer {value!r}: use NAME=ACCOUNT or NAME=ACCOUNT@REGION, e.g. "
                         "voice-app=444455556666@ap-northeast-2 (NAME: lower-case letters, digits, dashes)")
    name, account, region = match.groups()
    return ConsumerAnswer(name, check_account(account, f"--consumer {name}"),
                          check_region(region, f"--consumer {name}") if region else None)


def _instance_for(region: str) -> str:
    offered = catalog.availability()
    for family, instance in INSTANCE_CHOICES:
        if region in offered.get(family, ()):
            return instance
    return INSTANCE_CHOICES[0][1]  # validate names where it is offered


def _models(ids: tuple[str, ...]) -> list[str]:
    """One model: the single-model form (`model:`, its engine at the top). Several: a `models:` list, each with
    its own engine and size, every pool serving one copy of each."""
    def body(model: str, indent: str) -> list[str]:
        preset = MODEL_PRESETS[model]
        return [
            f"{indent}family: {preset['family']}",
            f"{indent}source: {preset['source']}   # staged into each region's bucket by `fleetcast stage model`",
            f"{indent}revision: main".ljust(34) + "# pin a commit sha; `fleetcast stage model` prints the one it fetched",
            f"{indent}context_length: {preset['context_length']}",
            f"{indent}max_input_len: {preset['max_input_len']}",
            f"{indent}max_output_len: {preset['max_output_len']}",
        ]

    if len(ids) == 1:
        (model,) = ids
        preset = MODEL_PRESETS[model]
        return ["model:", f"  id: {model}", *body(model, "  "), "",
                "engine:", f"  backend: {preset['backend']}", f"  precision: {preset['precision']}", ""]
    out = ["models:                            # each pool serves one copy of every model (pools[].serves to change)"]
    for model in ids:
        preset = MODEL_PRESETS[model]
        out += [f"  - id: {model}".ljust(35) + "# the OpenAI `model` value consumers send", *body(model, "    "),
                f"    parameters_b: {preset['parameters_b']}".ljust(35) + "# weights (billions), for the GPU memory check",
                f"    engine: {{backend: {preset['backend']}, precision: {preset['precision']}}}", ""]
    return out


def render(answers: InitAnswers) -> str:
    """The config text: the single-model form for one model, a `models:` list for several. Raises ValueError
    for answers no config could satisfy (unknown or repeated model)."""
    for model in answers.models:
        if model not in MODEL_PRESETS:
            raise ValueError(f"--model {model!r} is not one init knows; choose one of: {', '.join(MODEL_PRESETS)} "
                             "(then edit the model's entry for another)")
    repeated = sorted({m for m in answers.models if answers.models.count(m) > 1})
    if repeated:
        raise ValueError(f"--model {repeated[0]!r} is given twice; a fleet serves each model once (a pool's "
                         "`serves` sets copies)")
    if not answers.models:
        raise ValueError(f"--model: name at least one model ({', '.join(MODEL_PRESETS)})")
    if not answers.regions:
        raise ValueError("--regions: name at least one provider region, e.g. --regions ap-northeast-2")
    if not answers.consumers:
        raise ValueError("--consumer: name at least one consumer (NAME=ACCOUNT[@REGION]); the endpoint service "
                         "admits only listed accounts")
    home = answers.regions[0]
    served: dict[str, list[ConsumerAnswer]] = {r: [] for r in answers.regions}
    cross: dict[str, set[str]] = {r: set() for r in answers.regions}
    placement = []
    for consumer in answers.consumers:
        region = consumer.region or home
        # Out of the provider regions, the first one cross-region PrivateLink connects it to.
        reachable = [r for r in answers.regions if catalog.cross_region_supported(region, r)]
        service = region if region in served else (reachable or [home])[0]
        served[service].append(consumer)
        if region != service:
            cross[service].add(region)
        placement.append((consumer, region, service))

    out = [
        "# Fleetcast config written by `fleetcast config init`. Field reference: docs/config.md.",
        "# Every field left out keeps its default (the reference lists them). Lines marked REPLACE hold",
        "# values init could not know: fill them in, then `fleetcast config validate` this file.",
        "version: 1",
        f"name: {answers.name}",
        "provider:",
        f'  account: "{answers.account}"          # quoted: account ids are strings of 12 digits',
        "",
        *_models(answers.models),
        "slo:",
        "  ttft_p99_ms: 300",
        "  itl_p99_ms: 40",
        "",
        "regions:",
    ]
    for i, region in enumerate(answers.regions):
        prefix = az_id_prefix(region)
        principals = sorted({c.account for c in served[region]}) or [answers.account]
        out += [
            f"  - region: {region}",
            "    availability_zones:            # REPLACE if needed: AZ names map to IDs per account; check with",
            f"                                   #   aws ec2 describe-availability-zones --region {region}",
            f"      - {{name: {region}a, id: {prefix}-az1}}",
            f"      - {{name: {region}b, id: {prefix}-az2}}",
            "    vpc:",
            f"      cidr: 10.{40 + i}.0.0/16        # a new VPC; one /20 private subnet per AZ is carved from it",
            "    ami:",
            "      id: latest                   # follows the DLAMI's public SSM parameter; pin an ami-... id for production",
            "    allowed_principals:            # who may create endpoints to this region's service",
            *[f"      - arn:aws:iam::{account}:root" for account in principals],
            f"    allowed_regions: [{', '.join(sorted(cross[region]))}]",
            "    pools:",
            "      - name: gpu",
            f"        instance_type: {_instance_for(region)}",
            "        capacity: {min: 1, max: 4}",
        ]
    out += ["", "consumers:"]
    for j, (consumer, region, service) in enumerate(placement):
        prefix = az_id_prefix(region)
        out += [
            f"  - name: {consumer.name}",
            f'    account: "{consumer.account}"',
            f"    region: {region}",
            f"    service_region: {service}" + ("          # cross-region PrivateLink" if region != service else ""),
            f"    vpc_id: vpc-{j:08x}{'0' * 9}     # REPLACE: the consumer's VPC",
            "    subnets:                       # REPLACE: one private subnet per AZ, with its AZ ID",
            f"      - {{id: subnet-{2 * j:08x}{'0' * 9}, az_id: {prefix}-az1}}",
            f"      - {{id: subnet-{2 * j + 1:08x}{'0' * 9}, az_id: {prefix}-az2}}",
            f"    cidrs: [{PLACEHOLDER_CIDRS[j % len(PLACEHOLDER_CIDRS)]}]     # REPLACE: the consumer's client ranges (admitted to the NLB)",
            "    # endpoint_service_name: add the provider stack's EndpointServiceName output after its deploy",
        ]
    out += ["", "tags:", f"  project: {answers.name}", ""]
    return "\n".join(out)
