"""Benchmark mode (`cdk synth -c bench=true`) of a fleet of several models: a packed pool's bench instance
measures every model alone and all at once at each engine process's own port, writes one pair of results per
model (and may write nothing else); the consumer probe measures each model the consumer may call; a pool with
copies above 1 is refused by name (one process per model is driven)."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from fleetcast.contract.bucket import bench_packed_key, packed_model_key, probe_model_key, probe_results_key
from fleetcast.contract.errors import UserError
from fleetcast.contract.serving import process_slots
from tests.bench.conftest import fake_wheelhouse
from tests.stacks.synthesized import synthesize

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "examples" / "multi-model" / "fleet.yaml"


def _doc(copies: int = 1) -> dict:
    doc = YAML(typ="safe").load(MULTI.read_text())
    for serve in doc["regions"][0]["pools"][0]["serves"]:  # pool l40s: qwen2.5-0.5b has copies 2 as shipped
        serve["copies"] = copies if serve["model"] == "qwen2.5-0.5b" else 1
    return doc


def _context() -> dict:
    wheels = fake_wheelhouse(Path(tempfile.mkdtemp(prefix="fleetcast-wheels-")))
    return {"bench": "true", "bench_run": "r1", "bench_concurrency": "1,4,16", "bench_probe_wheels": str(wheels)}


@pytest.fixture(scope="module")
def packed():
    return synthesize(_doc(), "bench-models", _context())


def _user_data(syn, stack: str) -> list[str]:
    return [json.dumps(r["Properties"]["LaunchTemplateData"].get("UserData"))
            for r in syn.resources(stack, "AWS::EC2::LaunchTemplate").values()]


def _put_resources(syn, stack: str, group: str) -> list[str]:
    """The S3 objects the role that scales `group` to zero may write (its UploadOwnBenchResults statement)."""
    for policy in syn.resources(stack, "AWS::IAM::Policy").values():
        statements = {st.get("Sid"): st for st in policy["Properties"]["PolicyDocument"]["Statement"]}
        if "UploadOwnBenchResults" in statements and f'autoScalingGroupName/{group}"' in json.dumps(
                statements["ScaleOwnGroupToZero"]):
            resource = statements["UploadOwnBenchResults"]["Resource"]
            return [json.dumps(r) for r in (resource if isinstance(resource, list) else [resource])]
    raise AssertionError(f"no bench upload policy for {group}")


def test_a_packed_pools_bench_instance_drives_each_models_own_process(packed):
    cfg = packed.cfg
    region = cfg.regions[0]
    stack = next(n for n, s in packed.stacks.items() if getattr(s, "region_cfg", None) is not None)
    bench = [u for u in _user_data(packed, stack) if "FLEETCAST_BENCH_KEY" in u]
    assert len(bench) == len(region.pools)
    for pool in region.pools:
        served = cfg.served_by(pool)
        ports = {s.model_id: s.port for s in process_slots(served)}  # what the runtime starts and the gateway routes
        key = bench_packed_key("r1", region.region, pool.instance_type)
        (ud,) = [u for u in bench if f"FLEETCAST_POOL={pool.name}\\n" in u]
        models = ",".join(f"{s.model.id}:{ports[s.model.id]}:{s.engine.precision.value}:{s.engine.backend.value}"
                          for s in served)
        assert f"FLEETCAST_BENCH_KEY={key}" in ud and f"FLEETCAST_BENCH_MODELS={models}" in ud
        assert "FLEETCAST_BENCH_MODEL_MIX=gpt2-xl:0.333333,qwen2.5-0.5b:0.333333,qwen2.5-3b:0.333334" in ud
        assert "model=" not in ud.split("FLEETCAST_BENCH_LABELS=")[1].split("\\n")[0]  # per model, not per instance
        packing = ",".join(f"{s.model.id}:1" + ("" if s.kv_cache_bytes is None else f":{s.kv_cache_bytes / 2**30:g}")
                           for s in served)
        assert f"FLEETCAST_BENCH_PACKING={packing}" in ud
        # Least privilege: exactly each model's two files and the failure note.
        allowed = _put_resources(packed, stack, f"{cfg.name}-{region.region}-bench-{pool.name}")
        want = [packed_model_key(key, s.model.id, s.engine.precision.value, t) for s in served for t in (False, True)]
        want.append(key.removesuffix(".json") + ".error.txt")
        assert len(allowed) == len(want) and all(any(w in a for a in allowed) for w in want)


def test_the_probe_measures_each_model_the_consumer_may_call(packed):
    cfg = packed.cfg
    for consumer, models in (("voice-app", "gpt2-xl,qwen2.5-0.5b,qwen2.5-3b"), ("analytics", "gpt2-xl,qwen2.5-0.5b")):
        stack = next(n for n in packed.stacks if n.endswith(f"consumer-{consumer}"))
        (ud,) = [u for u in _user_data(packed, stack) if "FLEETCAST_BENCH_KEY" in u]
        assert f"FLEETCAST_BENCH_PROBE_MODELS={models}" in ud
        key = probe_results_key("r1", cfg.regions[0].region, consumer)
        allowed = _put_resources(packed, stack, f"{cfg.name}-{consumer}-bench-probe")
        assert all(any(probe_model_key(key, m) in a for a in allowed) for m in models.split(","))
        assert not any(f"{consumer}.json\"" in a for a in allowed)  # no one-model key


def test_copies_above_one_are_refused_by_name():
    with pytest.raises(UserError, match=r"-c bench=true: pool l40s serves qwen2\.5-0\.5b with copies 2; a bench "
                                        r"instance drives one engine process per model"):
        synthesize(copy.deepcopy(_doc(copies=2)), "bench-copies", _context())
