"""The region bucket's layout: every prefix and key recipe that `fleetcast stage`, the stacks (IAM scopes,
lifecycle rules) and the instance runtime use. The manifest written under a prefix: contract/manifest.py.

    models/<model id>/<revision>/             the staged checkpoint (`fleetcast stage model`), manifest last
    models/<model id>/<revision>/adapters/<adapter id>/<adapter revision>/
                                              a staged LoRA adapter of that model (`fleetcast stage adapter`)
    calibration/<name>/lambada/<split>.jsonl  a staged calibration set (`fleetcast stage calibration`)
    engines/<key>/manifest.json               the engine cache's entry, written last (runtime/engine_cache.py)
    engines/<key>/builds/<build id>/          one immutable prefix per build attempt
    locks/<key>.json                          the build lock (conditional writes only)
    failures/<key>/<n>.json                   one marker per failed build (the circuit breaker)
    plan/baseline.json                        the plan baseline the drift check reads (`fleetcast stage plan-baseline`)
    bench/<run>/...                           bench results (bench instances here; the probe in its own bucket)
"""

from __future__ import annotations

from .model_ids import model_slug

MODELS = "models/"
CALIBRATION = "calibration/"
ENGINES = "engines/"
LOCKS = "locks/"
FAILURES = "failures/"
BENCH = "bench/"

# Written by `fleetcast stage`, only read by instances.
READ_ONLY_PREFIXES = (MODELS, CALIBRATION)
# The engine cache, build locks and failure records: instances write them.
READ_WRITE_PREFIXES = (ENGINES, LOCKS, FAILURES)

# Where the plan baseline is staged in each provider region's model bucket (`fleetcast stage plan-baseline`),
# read by the scheduled drift check (stacks/plan_drift.py).
PLAN_BASELINE_KEY = "plan/baseline.json"


def model_prefix(model_id: str, revision: str) -> str:
    """Where a model's files live in a region bucket; the revision pins the content. The id enters as its slug
    (fleetcast/contract/model_ids.py): one key segment, so org/name ids cannot nest into another's prefix."""
    return f"{MODELS}{model_slug(model_id)}/{revision}/"


def adapter_prefix(model_id: str, model_revision: str, adapter_id: str, adapter_revision: str) -> str:
    """Where a LoRA adapter of a model lives: under its base model's revision, which it was trained against, and
    inside the models/ prefix instances may already read (no wider grant for adapters)."""
    return f"{model_prefix(model_id, model_revision)}adapters/{model_slug(adapter_id)}/{adapter_revision}/"


def calibration_prefix(name: str) -> str:
    return f"{CALIBRATION}{name}/"


def engine_prefix(key: str) -> str:
    return f"{ENGINES}{key}/"


def engine_build_prefix(key: str, build_id: str) -> str:
    return f"{engine_prefix(key)}builds/{build_id}/"


def lock_key(key: str) -> str:
    return f"{LOCKS}{key}.json"


def failure_prefix(key: str) -> str:
    return f"{FAILURES}{key}/"


def bench_results_key(run: str, region: str, instance_type: str, precision: str) -> str:
    """A bench instance's results file in its region's model bucket."""
    return f"{BENCH}{run}/{region}/{instance_type}/{precision}.json"


def bench_packed_key(run: str, region: str, instance_type: str) -> str:
    """A bench instance of a pool that serves several models: the key its failure note derives from
    (`.error.txt` in place of `.json`); its results are packed_model_key's, one pair per model."""
    return f"{BENCH}{run}/{region}/{instance_type}/packed.json"


def packed_model_key(pool_key: str, model: str, precision: str, together: bool) -> str:
    """One model's results of a packed bench instance (pool_key: bench_packed_key): `<model>/<precision>.json`
    measured with the other models loaded and idle, `<model>/<precision>-mix.json` with every model busy at once."""
    return f"{pool_key.rsplit('/', 1)[0]}/{model_slug(model)}/{precision}{'-mix' if together else ''}.json"


def probe_results_key(run: str, service_region: str, consumer: str) -> str:
    """The consumer-side probe's results file, in the consumer's own results bucket."""
    return f"{BENCH}{run}/{service_region}/privatelink/{consumer}.json"


def probe_model_key(probe_key: str, model: str) -> str:
    """One model's results of the consumer-side probe of a fleet of several models (probe_key: probe_results_key):
    `<consumer>/<model>.json`, each model measured alone through the consumer's endpoint."""
    return f"{probe_key.removesuffix('.json')}/{model_slug(model)}.json"
