"""`fleetcast stage model|adapter|calibration|image|status`: put what fleets need where they can reach it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetcast.config import FleetConfig
    from fleetcast.config.model import ModelSpec

# (service, region) -> a boto3 client
Clients = Callable[[str, str], Any]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("stage", help="stage model weights, LoRA adapters, calibration data and the serving image for "
                                          "offline fleets")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    from fleetcast.aws_session import add_aws_arguments

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", default="config/fleet.yaml", help="fleet config (default: %(default)s)")
        add_aws_arguments(p, region="many", region_help="provider region to stage into (repeatable; default: all)")

    def buckets(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bucket", action="append", metavar="REGION=NAME",
                       help="region bucket, instead of reading the provider stack's output (repeatable)")
        p.add_argument("--part-size-mib", type=int, default=64, help="multipart part size (>= 5, default %(default)s)")
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar on stderr (default: when stderr is a terminal)")

    model = actions.add_parser(
        "model", help="fetch model.source at model.revision once, upload to every region bucket",
        description="Fetch model.source at model.revision once (or take --local-dir) and stage it into every region "
                    "bucket: only what the build reads, i.e. top-level *.safetensors (+ shard index), config.json, "
                    "generation_config.json, hf_quant_config.json and the tokenizer files; other weight formats "
                    "(.bin, .h5, .msgpack, .ot, ONNX, ...) stay behind unless model.stage_patterns asks for them "
                    "(e.g. ['*.bin'] for a model without safetensors). Prints the staged size and what it left out.")
    common(model)
    buckets(model)
    model.add_argument("--local-dir", type=Path, help="stage this directory instead of downloading from the hub "
                                                       "(one model: with several, name it with --model)")
    model.add_argument("--model", dest="model_id", metavar="ID",
                       help="the models[].id to stage (default: every model of the config, one after another)")
    model.set_defaults(handler=_model)

    adapter = actions.add_parser(
        "adapter", help="fetch each LoRA adapter (models[].adapters) once, check it, upload to every region bucket",
        description="Fetch each adapter of models[].adapters once (hub source at its revision, an s3:// source with "
                    "your credentials, or --local-dir) and stage its adapter_config.json and adapter_model "
                    "weights under models/<model>/<model revision>/adapters/<id>/<revision>/ in every region bucket. "
                    "adapter_config.json is checked where TensorRT-LLM would refuse it (a LoRA adapter with a rank "
                    "and module names its PyTorch backend maps); its rank and modules go into the staged manifest, "
                    "from which instances set the engine's LoRA options.")
    common(adapter)
    buckets(adapter)
    adapter.add_argument("--model", dest="model_id", metavar="ID", help="only this model's adapters")
    adapter.add_argument("--adapter", dest="adapter_id", metavar="ID", help="only this adapter")
    adapter.add_argument("--local-dir", type=Path, help="stage this PEFT adapter directory instead of fetching the "
                                                        "source (one adapter: name it with --adapter)")
    adapter.set_defaults(handler=_adapter)

    calib = actions.add_parser(
        "calibration", help="stage a calibration dataset directory (SmoothQuant, INT8/FP8 KV, FP8)",
        description="Validate and stage a calibration set. Format: JSON Lines files (*.jsonl) directly in --dir, "
                    'one object per line with a non-empty string under "text", e.g. {"text": "A typical prompt of '
                    'your traffic ..."}; at least 512 rows in all (convert_checkpoint.py\'s SmoothQuant / INT8 KV '
                    "calibration reads 512; quantize.py's FP8 calibration reads calibration.samples). Other files "
                    "are ignored. A bad line is reported with its file, line and column. The set is staged as "
                    "calibration/NAME/lambada/{train,validation}.jsonl, the layout both TensorRT-LLM 1.2.x loaders "
                    "read offline (docs/runtime.md, 'Calibration sets').")
    common(calib)
    buckets(calib)
    calib.add_argument("--dir", type=Path, required=True, help="directory holding the *.jsonl files")
    calib.add_argument("--name", required=True, help="dataset name; staged under calibration/NAME/")
    calib.add_argument("--model", dest="model_id", metavar="ID",
                       help="the model whose calibration set this is (required when the config has several models: "
                            "each model calibrates on its own traffic)")
    calib.add_argument("--write-config", action=argparse.BooleanOptionalAction, default=True,
                       help="set the model's calibration.dataset in the config file to the staged set (default: on); "
                            "pools whose precision calibrates roll to it on the next deploy")
    calib.set_defaults(handler=_calibration)

    image = actions.add_parser("image", help="mirror the pinned TensorRT-LLM image into each region's ECR and pin its digest")
    common(image)
    image.add_argument("--method", choices=("codebuild", "local"), default="codebuild",
                       help="codebuild: the provider stack's mirror project (image stays in AWS); local: docker here")
    image.add_argument("--plain", action="store_true",
                       help="mirror the upstream image unchanged instead of building docker/Dockerfile on it; the "
                            "runtime then needs an image that already carries boto3 and ruamel.yaml")
    image.add_argument("--repository", action="append", metavar="REGION=URI", help="ECR repository URI override")
    image.add_argument("--project", action="append", metavar="REGION=NAME", help="CodeBuild project override")
    image.add_argument("--dry-run", action="store_true",
                       help="print what would run, change nothing (without AWS access: says what it could not look up)")
    image.add_argument("--write-config", action=argparse.BooleanOptionalAction, default=True,
                       help="pin engine.image_digest in the config file (default: on)")
    image.set_defaults(handler=_image)

    baseline = actions.add_parser(
        "plan-baseline", help="stage the plan baseline for the scheduled drift check (operations.plan_drift_check)",
        description="Upload the baseline `fleetcast plan --write-config` wrote next to the config "
                    "(<config>.plan-baseline.json) to s3://<model bucket>/plan/baseline.json in every provider region "
                    "it plans, where the drift Lambda reads it (docs/plan.md, Drift).")
    common(baseline)
    baseline.add_argument("--bucket", action="append", metavar="REGION=NAME",
                          help="region bucket, instead of reading the provider stack's output (repeatable)")
    baseline.add_argument("--file", type=Path, help="the baseline (default: <config>.plan-baseline.json)")
    baseline.set_defaults(handler=_plan_baseline)

    status = actions.add_parser("status", help="show whether each region's models, adapters and serving image are staged "
                                "(exit 1 if not; `fleetcast deploy` waits on the same check)")
    common(status)
    status.add_argument("--bucket", action="append", metavar="REGION=NAME")
    status.add_argument("--repository", action="append", metavar="REGION=URI", help="ECR repository URI override")
    status.set_defaults(handler=_status)


def _clients(args: argparse.Namespace, *, check: bool = True) -> Clients:
    """(service, region) -> client of the shared AWS session; fails first (exit 4) when there are no credentials."""
    from botocore.config import Config

    from fleetcast.aws_session import AwsSession

    # Transfers retry more than API calls: a multipart upload should survive a flaky link.
    aws = AwsSession.from_args(args, client_config=Config(retries={"mode": "standard", "max_attempts": 8}))
    if check:
        aws.require_credentials()
    return aws.client


def _regions(cfg: FleetConfig, args: argparse.Namespace) -> list[str]:
    from fleetcast.contract.errors import UserError

    known = [r.region for r in cfg.regions]
    chosen: list[str] = args.region or known
    for region in chosen:
        if region not in known:
            raise UserError(f"--region {region} is not a provider region in {args.config} ({', '.join(known)})", 2)
    return chosen


def _outputs(cfg: FleetConfig, region: str, clients: Clients) -> dict[str, str]:
    from fleetcast.contract.names import provider_stack_name
    from fleetcast.staging.aws import stack_outputs

    return stack_outputs(clients("cloudformation", region), provider_stack_name(cfg.name, region))


def _buckets(cfg: FleetConfig, args: argparse.Namespace, clients: Clients) -> dict[str, str]:
    from fleetcast.contract.errors import UserError
    from fleetcast.contract.names import provider_stack_name
    from fleetcast.contract.outputs import ProviderOutput, require_output
    from fleetcast.staging.aws import parse_region_map

    given = parse_region_map(args.bucket, "--bucket")
    known = [r.region for r in cfg.regions]
    for region in given:
        if region not in known:  # a typo would otherwise fall back to the stack output without a word
            raise UserError(f"--bucket {region}={given[region]}: {region} is not a provider region in {args.config} "
                            f"({', '.join(known)})", 2)
    out = {}
    for region in _regions(cfg, args):
        out[region] = given.get(region) or require_output(_outputs(cfg, region, clients), ProviderOutput.MODEL_BUCKET,
                                                          provider_stack_name(cfg.name, region),
                                                          "pass --bucket REGION=NAME")
    return out


def _plan_baseline(args: argparse.Namespace) -> int:
    import json

    from fleetcast.config import load_config
    from fleetcast.contract.bucket import PLAN_BASELINE_KEY
    from fleetcast.plan.drift import baseline_path, load_baseline

    cfg = load_config(args.config)
    clients = _clients(args)  # no credentials: exit 4 before anything is read
    path = args.file or baseline_path(args.config)
    doc = load_baseline(path)
    planned = sorted({p["region"] for p in doc["pools"]})
    if not args.region:
        args.region = [r for r in planned if r in {x.region for x in cfg.regions}]
    body = json.dumps(doc, indent=1).encode()
    for region, bucket in _buckets(cfg, args, clients).items():
        clients("s3", region).put_object(Bucket=bucket, Key=PLAN_BASELINE_KEY, Body=body, ContentType="application/json")
        print(f"{region}: s3://{bucket}/{PLAN_BASELINE_KEY} <- {path}")
    return 0


def _part_size(args: argparse.Namespace) -> int:
    from fleetcast.contract.errors import UserError

    if args.part_size_mib < 5 or args.part_size_mib > 5120:
        raise UserError(f"--part-size-mib must be between 5 and 5120, got {args.part_size_mib}", 2)
    size: int = args.part_size_mib * 1024 * 1024
    return size


def _model(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.contract.errors import UserError
    from fleetcast.staging.model import stage_model

    cfg = load_config(args.config)
    known = [m.id for m in cfg.models]
    chosen = [cfg.model_named(args.model_id).id] if args.model_id else known
    if args.local_dir is not None and len(chosen) > 1:
        raise UserError(f"--local-dir holds one model; {args.config} has {len(known)}: name it with --model "
                        f"({', '.join(known)})", 2)
    part_size = _part_size(args)
    clients = _clients(args)
    buckets = _buckets(cfg, args, clients)
    for model_id in chosen:
        result = stage_model(cfg, buckets, clients, local_dir=args.local_dir, part_size=part_size,
                             progress=args.progress, model_id=model_id)
        print("\n".join(result.lines()))
    return 0


def _adapter(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.staging.adapters import stage_adapters

    cfg = load_config(args.config)
    part_size = _part_size(args)
    clients = _clients(args)
    buckets = _buckets(cfg, args, clients)
    for result in stage_adapters(cfg, buckets, clients, model_id=args.model_id, adapter_id=args.adapter_id,
                                 local_dir=args.local_dir, part_size=part_size, progress=args.progress):
        print("\n".join(result.lines()))
    return 0


def _calibration(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.config.edit import edited_text, replace_files
    from fleetcast.contract.bucket import calibration_prefix
    from fleetcast.staging.calibration import check_name, read_rows
    from fleetcast.staging.model import stage_calibration

    # Everything local is checked first, offline: config, model, name, part size and the set itself.
    cfg = load_config(args.config)
    model = _calibrated_model(cfg, args.model_id)
    field, where = _calibration_field(args.config, model.id)
    check_name(args.name)
    part_size = _part_size(args)
    read_rows(args.dir)
    clients = _clients(args)
    buckets = _buckets(cfg, args, clients)
    # Each region's instances read the prefix in their own bucket (runtime/staged.py); the URI names the first.
    uri = f"s3://{next(iter(buckets.values()))}/{calibration_prefix(args.name)}"
    edit = edited_text(args.config, [(field, uri)]) if args.write_config else None
    result = stage_calibration(args.name, args.dir, buckets, clients,
                               samples=model.calibration.samples if model.calibration else None,
                               part_size=part_size, progress=args.progress)
    print("\n".join(result.lines()))
    if edit is None:
        print(f"set {where} in {args.config} to {uri} (each region reads the same prefix in its own bucket)")
    elif model.calibration is not None and model.calibration.dataset == uri:
        print(f"{where} in {args.config} already names {uri}")
    else:
        replace_files([(args.config, edit[0])])
        print(f"{where}: {uri} in {args.config} (each region reads the same prefix in its own bucket; "
              "pools whose precision calibrates roll to it on the next deploy: `fleetcast config diff`)")
    return 0


def _calibrated_model(cfg: FleetConfig, model_id: str | None) -> ModelSpec:
    """The model a calibration set is staged for: --model, or the config's only model."""
    from fleetcast.contract.errors import EXIT_USAGE, UserError

    ids = [m.id for m in cfg.models]
    if model_id is None:
        if len(ids) > 1:
            raise UserError(f"--model is needed: the config has {len(ids)} models ({', '.join(ids)}), and each "
                            "calibrates on its own set", EXIT_USAGE)
        return cfg.models[0]
    return cfg.model_named(model_id)


def _calibration_field(config: str, model_id: str) -> tuple[tuple[str | int, ...], str]:
    """Where the config file names `model_id`'s calibration set, as written: the single-model form's top-level
    `calibration.dataset`, or `models[i].calibration.dataset` in the list form; and that place in words."""
    from pathlib import Path

    from fleetcast.config.edit import round_trip_yaml

    doc = round_trip_yaml().load(Path(config).read_text())
    if "models" not in doc:
        return ("calibration", "dataset"), "calibration.dataset"
    index = next(i for i, m in enumerate(doc["models"]) if m.get("id") == model_id)
    return ("models", index, "calibration", "dataset"), f"models[{model_id}].calibration.dataset"


def _image(args: argparse.Namespace) -> int:
    from fleetcast.config import load_config
    from fleetcast.config.edit import apply_edits
    from fleetcast.contract.errors import FleetcastError
    from fleetcast.contract.names import provider_stack_name
    from fleetcast.contract.outputs import ProviderOutput, require_output
    from fleetcast.staging.aws import parse_region_map
    from fleetcast.staging.image import ImageTarget, single_digest, stage_codebuild, stage_local

    cfg = load_config(args.config)
    # A dry run computes the plan without AWS where it can, and says what it could not look up.
    clients = _clients(args, check=not args.dry_run)
    repos = parse_region_map(args.repository, "--repository")
    projects = parse_region_map(args.project, "--project")
    targets, unchecked = [], []
    for region in _regions(cfg, args):
        stack = provider_stack_name(cfg.name, region)
        outputs = None
        if not (region in repos and (region in projects or args.method == "local")):
            try:
                outputs = _outputs(cfg, region, clients)
            except FleetcastError as exc:  # not deployed, or no access: a dry run says so and goes on
                if not args.dry_run:
                    raise
                unchecked.append(f"{region}: stack {stack} outputs not read ({exc})")
        repo = repos.get(region) or (
            f"{cfg.provider.account}.dkr.ecr.{region}.amazonaws.com/<repository: output of {stack}>" if outputs is None
            else require_output(outputs, ProviderOutput.IMAGE_REPOSITORY, stack, "pass --repository REGION=URI"))
        project = None
        if args.method == "codebuild":
            project = projects.get(region) or (f"<image-mirror project: output of {stack}>" if outputs is None
                                               else require_output(outputs, ProviderOutput.IMAGE_MIRROR_PROJECT, stack,
                                                                  "pass --project REGION=NAME"))
        targets.append(ImageTarget(region=region, repository_uri=repo, project=project))
    stage = stage_codebuild if args.method == "codebuild" else stage_local
    digests = stage(cfg, targets, clients, derived=not args.plain, dry_run=args.dry_run)
    if unchecked:
        print("dry run: not checked (the plan above uses placeholders for them):")
        print("\n".join(f"  {line}" for line in unchecked))
    digest = single_digest(digests)
    if digest and args.write_config:
        apply_edits(args.config, [(("engine", "image_digest"), digest)])
        print(f"pinned engine.image_digest: {digest} in {args.config}")
    elif digest:
        print(f"digest: {digest} (not written: --no-write-config)")
    return 0


def _status(args: argparse.Namespace) -> int:
    """The model and the serving image each region's instances will read (fleetcast/staging/readiness.py,
    the same check `fleetcast deploy` waits on before it gives a new region capacity)."""
    from fleetcast.config import load_config
    from fleetcast.contract.bucket import model_prefix
    from fleetcast.contract.image import image_reference, instance_image_id
    from fleetcast.contract.names import provider_stack_name
    from fleetcast.contract.outputs import ProviderOutput, require_output
    from fleetcast.staging.aws import parse_region_map
    from fleetcast.staging.readiness import adapter_problems, image_problems, model_problems
    from fleetcast.staging.transfer import human_bytes, read_manifest

    cfg = load_config(args.config)
    clients = _clients(args)
    repositories = parse_region_map(args.repository, "--repository")
    missing = 0
    for region, bucket in _buckets(cfg, args, clients).items():
        problems = model_problems(cfg, clients("s3", region), bucket)
        missing += bool(problems)
        for model in cfg.models:
            mine = [p for p in problems if len(cfg.models) == 1 or p.startswith((f"model {model.id} ", f"model {model.id}:"))]
            missing_line = bool(mine) and " MISSING" in mine[0].split(":")[0]
            manifest = None if missing_line else read_manifest(clients("s3", region), bucket,
                                                               model_prefix(model.id, model.revision))
            if manifest is None:
                # Its problems say MISSING (the split above cuts an id holding ':', such as ft:base:org::id).
                print(f"{region}: {mine[0] if mine else f'model {model.id}@{model.revision}: manifest MISSING'}")
                continue
            state = "ok" if not mine else f"{len(mine)} problem(s): {mine[0]}"
            print(f"{region}: model {model.id}@{model.revision}: {len(manifest.files)} file(s), "
                  f"{human_bytes(manifest.total_bytes)}: {state}")
        adapters = adapter_problems(cfg, clients("s3", region), bucket)
        missing += bool(adapters)
        for model in cfg.models:
            for a in model.adapters:
                mine = [p for p in adapters if p.startswith(f"adapter {a.id} ")]
                print(f"{region}: " + (mine[0] if mine else f"adapter {a.id}@{a.revision} of {model.id}: ok"))
        repository = repositories.get(region) or require_output(
            _outputs(cfg, region, clients), ProviderOutput.IMAGE_REPOSITORY, provider_stack_name(cfg.name, region))
        image = image_problems(cfg, clients("ecr", region), repository)
        missing += bool(image)
        print(f"{region}: " + (image[0] if image else f"image {image_reference(repository, instance_image_id(cfg))}: ok"))
    return 1 if missing else 0
