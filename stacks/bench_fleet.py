"""Benchmark mode (`cdk synth -c bench=true`): one single-instance group per
candidate pool, launched through the fleet's own GpuFleet construct (same launch
template path, AMI, role shape, user data and runtime), that serves its pool's
engine, runs `fleetcast bench` against itself (fleetcast/bench/job.py), uploads
the results file to the region bucket and scales its group to zero.

Candidates are the config's pools (instance type x engine precision): to compare
candidates that are not in the serving config, write a bench config listing
them as pools and synth it with `-c config=config/bench.yaml -c bench=true`.
Bench groups are not behind the NLB and get no scaling, warm pool or rollout.

A pool serving several models gets one bench instance too, running every model's engine process as the
pool does: the job measures each model alone (the others loaded and idle), then all at once
(`--model-mix`, equal shares, each model at its own process's port), and writes one pair of results per
model with the pool's packing (fleetcast/contract/bucket.py packed_model_key). It drives one process per
model, so a pool with `copies` above 1 is refused: bench a config whose pool serves copies 1.

Context knobs (all optional): bench_run (results prefix, default "latest"),
bench_concurrency (default 1,2,4,8,16,32,64), bench_requests (200),
bench_input_tokens (128), bench_output_tokens (128).
"""

from __future__ import annotations

import re

from aws_cdk import aws_iam as iam
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.config.model import GIB, Capacity, WarmPoolSpec
from fleetcast.contract.bench import KNOB_DEFAULTS
from fleetcast.contract.bucket import bench_packed_key, bench_results_key, packed_model_key
from fleetcast.contract.context import Context, is_true
from fleetcast.contract.errors import UserError
from fleetcast.contract.instance_env import Var
from fleetcast.contract.model_ids import model_slug

from .gpu_fleet import GpuFleet, asg_name

# What each `-c` knob may hold: it reaches the instance's env file, which takes no quoting.
_KNOB_FORMS = {
    "bench_run": (re.compile(r"[A-Za-z0-9._-]{1,64}"), "1-64 of A-Z a-z 0-9 . _ - (an S3 key part)"),
    "bench_concurrency": (re.compile(r"[1-9][0-9]{0,4}(,[1-9][0-9]{0,4})*"),
                          "positive integers separated by commas, no spaces (e.g. 1,2,4,8)"),
    "bench_requests": (re.compile(r"[1-9][0-9]{0,6}"), "a positive integer"),
    "bench_input_tokens": (re.compile(r"[1-9][0-9]{0,6}"), "a positive integer"),
    "bench_output_tokens": (re.compile(r"[1-9][0-9]{0,6}"), "a positive integer"),
}


def bench_knobs(scope: Construct, defaults: dict[str, str] = KNOB_DEFAULTS) -> dict[str, str]:
    """The bench `-c` knobs with their defaults, each checked against its form (UserError naming it)."""
    knobs = {k: str(scope.node.try_get_context(k) or v) for k, v in defaults.items()}
    for name, (form, allowed) in _KNOB_FORMS.items():
        if name in knobs and not form.fullmatch(knobs[name]):
            raise UserError(f"-c {name}={knobs[name]!r}: use {allowed}")
    # The bench job refuses a level its request count cannot reach (fleetcast bench --requests-per-level).
    top = max(int(level) for level in knobs["bench_concurrency"].split(","))
    if top > int(knobs["bench_requests"]):
        raise UserError(f"-c bench_concurrency level {top} exceeds -c bench_requests={knobs['bench_requests']}: "
                        f"a level of {knobs['bench_requests']} requests never has {top} in flight; "
                        f"raise bench_requests to >= {top} or drop the level")
    return knobs


def bench_enabled(scope: Construct) -> bool:
    return is_true(scope.node.try_get_context(Context.BENCH.value))


class BenchFleets(Construct):
    """Bench groups for every pool of one provider region; `fleets` maps pool name -> GpuFleet."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region, provider) -> None:
        super().__init__(scope, construct_id)
        knobs = bench_knobs(self)
        inputs = provider.instance_inputs
        self.fleets: dict[str, GpuFleet] = {}
        self.keys: dict[str, str] = {}
        for pool in region.pools:
            served = cfg.served_by(pool)
            packed = len(served) > 1
            engine = served[0].engine
            precision = engine.precision.value
            key = (bench_packed_key(knobs["bench_run"], region.region, pool.instance_type) if packed else
                   bench_results_key(knobs["bench_run"], region.region, pool.instance_type, precision))
            # A distinct group name (bench-<pool>) so it never collides with the serving group;
            # FLEETCAST_POOL keeps the real pool so the runtime builds and serves that pool's engine.
            bench_pool = pool.model_copy(update={
                "name": f"bench-{pool.name}"[:32].rstrip("-"),
                "capacity": Capacity(min=0, desired=1, max=1),
                "warm_pool": WarmPoolSpec(size=0),
                "spot": None,  # a bench run is one On-Demand instance: measurements must not be reclaimed
            })
            group = asg_name(cfg, region, bench_pool)
            if packed:
                labels = ",".join([f"instance_type={pool.instance_type}", f"region={region.region}", "path=instance"])
                packed_env, results = _packed_env(cfg, pool, key)
            else:
                labels = ",".join([f"instance_type={pool.instance_type}", f"precision={precision}",
                                   f"region={region.region}", f"backend={engine.backend.value}",
                                   f"model={served[0].model.id}", "path=instance"])
                packed_env, results = {}, [key]
            fleet = GpuFleet(
                self, f"Bench-{pool.name}", cfg=cfg, region=region, pool=bench_pool,
                vpc=provider.network.vpc, subnets=provider.network.subnets,
                security_group=provider.instance_security_group, inputs=inputs,
                extra_env={
                    Var.POOL: pool.name,
                    Var.BENCH_KEY: key,
                    Var.BENCH_GROUP: group,
                    # The model server itself (runtime/serve.py: 127.0.0.1:engine.port+1); the gateway on
                    # engine.port requires PROXY protocol v2 and has its own benchmark (bench_gateway).
                    Var.BENCH_ENDPOINT: f"http://127.0.0.1:{cfg.engine.port + 1}",
                    Var.BENCH_CONCURRENCY: knobs["bench_concurrency"],
                    Var.BENCH_REQUESTS: knobs["bench_requests"],
                    Var.BENCH_INPUT_TOKENS: knobs["bench_input_tokens"],
                    Var.BENCH_OUTPUT_TOKENS: knobs["bench_output_tokens"],
                    Var.BENCH_LABELS: labels,
                    **packed_env,
                },
            )
            bucket = provider.model_store.bucket
            # Exactly its own results object (and failure note), and its own group's capacity.
            fleet.role.add_to_policy(iam.PolicyStatement(
                sid="UploadOwnBenchResults",
                actions=["s3:PutObject"],
                resources=[*(bucket.arn_for_objects(k) for k in results),
                           bucket.arn_for_objects(key.removesuffix(".json") + ".error.txt")],
            ))
            fleet.role.add_to_policy(iam.PolicyStatement(
                sid="ScaleOwnGroupToZero",
                actions=["autoscaling:SetDesiredCapacity"],
                resources=[fleet._asg_arn()],
            ))
            self.fleets[pool.name] = fleet
            self.keys[pool.name] = key


def _packed_env(cfg: FleetConfig, pool, key: str) -> tuple[dict[Var, str], list[str]]:
    """A packed pool's bench env (each model's process port, precision and backend; an equal-share mix; the
    pool's packing) and every results key its job writes."""
    from fleetcast.contract.serving import process_slots

    served = cfg.served_by(pool)
    many = [s for s in served if s.copies > 1]
    if many:
        raise UserError(f"-c bench=true: pool {pool.name} serves {many[0].model.id} with copies {many[0].copies}; a "
                        "bench instance drives one engine process per model, so its figures would leave the other "
                        f"copies idle: bench a config whose pool {pool.name} serves copies: 1 of each model")
    ports = {slot.model_id: slot.port for slot in process_slots(served)}
    models = [(s.model.id, ports[s.model.id], s.engine.precision.value, s.engine.backend.value) for s in served]
    # Equal shares written to 6 decimals, the last taking the rest, so they sum to 1 as --model-mix requires.
    shares = [round(1 / len(models), 6)] * (len(models) - 1)
    shares.append(round(1 - sum(shares), 6))
    env = {
        Var.BENCH_MODELS: ",".join(f"{m}:{port}:{precision}:{backend}" for m, port, precision, backend in models),
        Var.BENCH_MODEL_MIX: ",".join(f"{m}:{share:g}" for (m, *_), share in zip(models, shares)),
        # MODEL:COPIES[:KV_GIB]: an id with ':' goes as its slug, which parse_packing reads back.
        Var.BENCH_PACKING: ",".join(f"{model_slug(s.model.id)}:{s.copies}" + ("" if s.kv_cache_bytes is None else
                                                                   f":{s.kv_cache_bytes / GIB:g}") for s in served),
        Var.BENCH_GPU_SHARING: pool.gpu_sharing.value,
    }
    results = [packed_model_key(key, m, precision, together) for m, _, precision, _ in models
               for together in (False, True)]
    return env, results
