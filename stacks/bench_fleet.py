"""Benchmark mode (`cdk synth -c bench=true`): one single-instance group per
candidate pool, launched through the fleet's own GpuFleet construct (same launch
template path, AMI, role shape, user data and runtime), that serves its pool's
engine, runs `fleetcast bench` against itself (runtime/bench_job.py), uploads
the results file to the region bucket and scales its group to zero.

Candidates are the config's pools (instance type x engine precision): to compare
candidates that are not in the serving config, write a bench config listing
them as pools and synth it with `-c config=config/bench.yaml -c bench=true`.
Bench groups are not behind the NLB and get no scaling, warm pool or rollout.

Context knobs (all optional): bench_run (results prefix, default "latest"),
bench_concurrency (default 1,2,4,8,16,32,64), bench_requests (200),
bench_input_tokens (128), bench_output_tokens (128).
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct

from fleetcast.config import FleetConfig, Region
from fleetcast.config.model import Capacity, WarmPoolSpec

from .gpu_fleet import GpuFleet, asg_name

RESULTS_PREFIX = "bench/"
DEFAULTS = {
    "bench_run": "latest",
    "bench_concurrency": "1,2,4,8,16,32,64",
    "bench_requests": "200",
    "bench_input_tokens": "128",
    "bench_output_tokens": "128",
}


def bench_enabled(scope: Construct) -> bool:
    return str(scope.node.try_get_context("bench")).lower() in ("true", "1", "yes")


def results_key(run: str, region: str, instance_type: str, precision: str) -> str:
    return f"{RESULTS_PREFIX}{run}/{region}/{instance_type}/{precision}.json"


class BenchFleets(Construct):
    """Bench groups for every pool of one provider region; `fleets` maps pool name -> GpuFleet."""

    def __init__(self, scope: Construct, construct_id: str, *, cfg: FleetConfig, region: Region, provider) -> None:
        super().__init__(scope, construct_id)
        knobs = {k: str(self.node.try_get_context(k) or v) for k, v in DEFAULTS.items()}
        inputs = provider.instance_inputs
        self.fleets: dict[str, GpuFleet] = {}
        self.keys: dict[str, str] = {}
        for pool in region.pools:
            engine = cfg.engine_for(pool)
            precision = engine.precision.value
            key = results_key(knobs["bench_run"], region.region, pool.instance_type, precision)
            # A distinct group name (bench-<pool>) so it never collides with the serving group;
            # FLEETCAST_POOL keeps the real pool so the runtime builds and serves that pool's engine.
            bench_pool = pool.model_copy(update={
                "name": f"bench-{pool.name}"[:32].rstrip("-"),
                "capacity": Capacity(min=0, desired=1, max=1),
                "warm_pool": WarmPoolSpec(size=0),
            })
            group = asg_name(cfg, region, bench_pool)
            labels = ",".join([f"instance_type={pool.instance_type}", f"precision={precision}",
                               f"region={region.region}", f"backend={engine.backend.value}",
                               f"model={cfg.model.id}", "path=instance"])
            fleet = GpuFleet(
                self, f"Bench-{pool.name}", cfg=cfg, region=region, pool=bench_pool,
                vpc=provider.network.vpc, subnets=provider.network.subnets,
                security_group=provider.instance_security_group, inputs=inputs,
                extra_env={
                    "FLEETCAST_POOL": pool.name,
                    "FLEETCAST_BENCH_KEY": key,
                    "FLEETCAST_BENCH_GROUP": group,
                    # The model server itself (runtime/serve.py: 127.0.0.1:engine.port+1); the gateway on
                    # engine.port requires PROXY protocol v2 and has its own benchmark (bench_gateway).
                    "FLEETCAST_BENCH_ENDPOINT": f"http://127.0.0.1:{cfg.engine.port + 1}",
                    "FLEETCAST_BENCH_CONCURRENCY": knobs["bench_concurrency"],
                    "FLEETCAST_BENCH_REQUESTS": knobs["bench_requests"],
                    "FLEETCAST_BENCH_INPUT_TOKENS": knobs["bench_input_tokens"],
                    "FLEETCAST_BENCH_OUTPUT_TOKENS": knobs["bench_output_tokens"],
                    "FLEETCAST_BENCH_LABELS": labels,
                },
            )
            bucket = provider.model_store.bucket
            # Exactly its own results object (and failure note), and its own group's capacity.
            fleet.role.add_to_policy(iam.PolicyStatement(
                sid="UploadOwnBenchResults",
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects(key), bucket.arn_for_objects(key.removesuffix(".json") + ".error.txt")],
            ))
            fleet.role.add_to_policy(iam.PolicyStatement(
                sid="ScaleOwnGroupToZero",
                actions=["autoscaling:SetDesiredCapacity"],
                resources=[fleet._asg_arn()],
            ))
            self.fleets[pool.name] = fleet
            self.keys[pool.name] = key
