"""`fleetcast stage adapter`: a model's LoRA adapters, staged like its weights.

Each adapter (models[].adapters[]: a PEFT LoRA directory) is fetched once (hub at its revision, an
s3:// prefix with the operator's credentials, or --local-dir), checked where the engine would refuse
it (adapter_config.json: LoRA, a rank, module names TensorRT-LLM maps), and staged with a manifest
that records its rank and TensorRT-LLM target modules (fleetcast/contract/adapters.py), so an
instance sizes its engine's LoRA cache from the manifest alone. The layout: contract/bucket.py
adapter_prefix.
"""

from __future__ import annotations

import glob
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetcast.config import FleetConfig
from fleetcast.config.model import AdapterSpec, ModelSpec
from fleetcast.contract.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MODULES_KEY,
    RANK_KEY,
    AdapterConfigError,
    adapter_shape,
)
from fleetcast.contract.bucket import adapter_prefix
from fleetcast.contract.errors import UserError
from fleetcast.contract.manifest import build_manifest

from .model import ClientFactory, StageResult, hub_errors, resolve_hub_token, stage_tree
from .transfer import DEFAULT_PART_SIZE, human_bytes


def adapter_files(files: dict[str, int], where: str) -> dict[str, int]:
    """What of a directory listing (path -> size) is staged: adapter_config.json and the adapter weights."""
    weights = [name for name in ADAPTER_WEIGHTS if name in files]
    if ADAPTER_CONFIG not in files or not weights:
        missing = ", ".join(([ADAPTER_CONFIG] if ADAPTER_CONFIG not in files else []) +
                            ([" or ".join(ADAPTER_WEIGHTS)] if not weights else []))
        raise UserError(f"{where} is not a PEFT LoRA adapter: no {missing} (files: {', '.join(sorted(files)) or 'none'})")
    # safetensors first: TensorRT-LLM's loader takes it over the pickle when both are there.
    return {ADAPTER_CONFIG: files[ADAPTER_CONFIG], weights[0]: files[weights[0]]}


def _find(model: ModelSpec, adapter_id: str) -> AdapterSpec:
    for adapter in model.adapters:
        if adapter.id == adapter_id:
            return adapter
    known = ", ".join(a.id for a in model.adapters) or "none"
    raise UserError(f"--adapter {adapter_id!r} is not an adapter of model {model.id}; its adapters: {known}", 2)


def _from_hub(adapter: AdapterSpec, dest: Path, token: str | None,
              log: Callable[[str], None]) -> tuple[dict[str, int], dict[str, Any]]:
    """Download the adapter's files into `dest`: what is staged (name -> size) and the manifest's extra fields."""
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise UserError("huggingface_hub is not installed; run `make synth` to set up the environment") from None
    info = HfApi(token=token).model_info(adapter.source, revision=adapter.revision, files_metadata=True)
    chosen = adapter_files({s.rfilename: s.size or 0 for s in info.siblings or []}, f"{adapter.source}@{info.sha}")
    log(f"{adapter.source}@{info.sha}: staging {', '.join(chosen)} ({human_bytes(sum(chosen.values()))})")
    snapshot_download(adapter.source, revision=info.sha, local_dir=str(dest), token=token,
                      allow_patterns=[glob.escape(p) for p in chosen])
    if info.sha != adapter.revision:
        log(f"note: revision {adapter.revision!r} of adapter {adapter.id} resolved to commit {info.sha}; pin it in "
            "adapters[].revision")
    return chosen, {"commit": info.sha}


def _from_s3(adapter: AdapterSpec, dest: Path, s3: Any,
             log: Callable[[str], None]) -> tuple[dict[str, int], dict[str, Any]]:
    """Download the adapter's files into `dest`: what is staged (name -> size) and the manifest's extra fields."""
    bucket, _, key = adapter.source[len("s3://"):].partition("/")
    prefix = key.rstrip("/") + "/" if key else ""
    listed: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if rel and "/" not in rel:  # the adapter's own files, not a subdirectory's
                listed[rel] = obj["Size"]
    chosen = adapter_files(listed, adapter.source)
    log(f"{adapter.source}: staging {', '.join(chosen)} ({human_bytes(sum(chosen.values()))})")
    for name in chosen:
        s3.download_file(bucket, prefix + name, str(dest / name))
    return chosen, {}


def stage_adapter(cfg: FleetConfig, model_id: str, adapter_id: str, buckets: dict[str, str], clients: ClientFactory,
                  *, local_dir: Path | None = None, part_size: int = DEFAULT_PART_SIZE, progress: bool | None = None,
                  log: Callable[[str], None] = print) -> StageResult:
    """Fetch, check and stage one adapter of one model into every region bucket."""
    model = cfg.model_by_id(model_id)
    adapter = _find(model, adapter_id)
    prefix = adapter_prefix(model.id, model.revision, adapter.id, adapter.revision)
    with tempfile.TemporaryDirectory(prefix="fleetcast-adapter-") as tmp:
        root = Path(tmp)
        extra: dict[str, Any]
        if local_dir is not None:
            if not local_dir.is_dir():
                raise UserError(f"--local-dir {local_dir} is not a directory")
            root, source, extra = local_dir, str(local_dir), {}
            chosen = adapter_files({p.name: p.stat().st_size for p in local_dir.iterdir() if p.is_file()},
                                   f"--local-dir {local_dir}")
        elif adapter.source.startswith("s3://"):
            chosen, extra = _from_s3(adapter, root, clients("s3", cfg.regions[0].region), log)
            source = adapter.source
        else:
            token = resolve_hub_token(cfg, clients, model)
            with hub_errors(f"models[{model.id}].adapters[{adapter.id}].source", adapter.source, adapter.revision):
                chosen, extra = _from_hub(adapter, root, token, log)
            source = f"hub:{adapter.source}"
        try:
            rank, modules = adapter_shape((root / ADAPTER_CONFIG).read_bytes(), f"adapter {adapter.id} ({source})")
        except AdapterConfigError as exc:
            raise UserError(str(exc)) from None
        log(f"adapter {adapter.id} of {model.id}: LoRA rank {rank}, TensorRT-LLM modules {', '.join(modules)}")
        manifest = build_manifest(root, kind="adapter", name=adapter.id, revision=adapter.revision, source=source,
                                  extra={**extra, "model": model.id, RANK_KEY: rank, MODULES_KEY: list(modules)},
                                  include=chosen.__contains__)
        return stage_tree(root, manifest, prefix, buckets, clients, part_size=part_size, progress=progress, log=log)


def stage_adapters(cfg: FleetConfig, buckets: dict[str, str], clients: ClientFactory, *, model_id: str | None = None,
                   adapter_id: str | None = None, local_dir: Path | None = None, part_size: int = DEFAULT_PART_SIZE,
                   progress: bool | None = None, log: Callable[[str], None] = print) -> list[StageResult]:
    """Every adapter of the config (or of `model_id`, or the one `adapter_id`), one after another."""
    if model_id is not None:
        cfg.model_named(model_id)
    chosen = [(m.id, a.id) for m in cfg.models if model_id in (None, m.id) for a in m.adapters
              if adapter_id in (None, a.id)]
    if adapter_id is not None and not chosen:
        known = ", ".join(a.id for m in cfg.models for a in m.adapters) or "none"
        raise UserError(f"--adapter {adapter_id!r} is not an adapter of {model_id or 'any model'}; adapters: {known}", 2)
    if not chosen:
        raise UserError("the config has no adapters to stage (models[].adapters)", 2)
    if local_dir is not None and len(chosen) > 1:
        raise UserError(f"--local-dir holds one adapter; name it with --adapter ({', '.join(a for _, a in chosen)})", 2)
    return [stage_adapter(cfg, m, a, buckets, clients, local_dir=local_dir, part_size=part_size, progress=progress,
                          log=log) for m, a in chosen]
