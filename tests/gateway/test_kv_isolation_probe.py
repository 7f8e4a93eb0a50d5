"""The cross-account prefix probe, on loopback: two accounts behind the gateway share one reference engine with
its prefix cache (block reuse keyed by cache_salt, as TensorRT-LLM's KV cache manager keys it).

The attacker (voice-app) wants to learn whether the victim (analytics) sent a prompt prefix. In each trial the
victim sends a fresh 192-token prefix P (three KV blocks) with a tail; the attacker then times two probes of its
own, in random order: P with a new tail, and a never-sent prefix Q of the same length with a new tail. Its
classifier says "sent" for the faster one; its ROC AUC is the share of trials in which the sent prefix's probe
was faster (Mann-Whitney, rank-based: no threshold, no model of the timings). A cache hit skips the prefix's
prefill compute, so without isolation the sent probe is much faster; with each account salted apart both probes
are misses and the classifier is a coin.

Why it cannot depend on machine load: the two probes of a trial run back to back, in random order, so load
shifts both alike; the AUC counts orders, not milliseconds. Through the gateway a trial costs three HTTP
requests, so these runs are short: the shared group's probe must clear 0.9, and the separated accounts' must
find no block of the other's and fall to a coin's AUC within 0.2 (a coin's standard deviation at 60 trials is
0.053). The bound of 0.55 is checked with the same design over 600 trials in-process, where a trial costs only
the engine's work (tests/runtime/test_reference_prefix_cache.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

from fleetcast.config import parse_config
from runtime.gateway.routing import Router
from runtime.gateway.salting import Salting
from runtime.reference.build import build_artifact
from runtime.reference.configs import TOKENS_PER_BLOCK
from tests.optional import needs_torch
from tests.runtime.reference_helpers import ONE_FORK_SERVER, ServerProcess

from .conftest import ANALYTICS_VPCE, MODEL_ID, VOICE_VPCE, fleet_config, start_harness, stop_harness
from .fakes import Client

pytestmark = [needs_torch, ONE_FORK_SERVER]

PREFIX = 3 * TOKENS_PER_BLOCK
TRIALS_SALTED = 60
TRIALS_SHARED = 60


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "artifact"
    build_artifact(out, size="wide", seed=9)  # a prefill gap that dwarfs a loaded machine's noise
    log = tmp_path_factory.mktemp("log") / "requests.jsonl"
    # Room for every trial's blocks: eviction is not what is under test.
    srv = ServerProcess(out, "--max-batch-size", "4", "--prefix-cache-blocks", "8192", "--request-log", str(log))
    try:
        srv.wait_healthy(timeout=300)  # loading is not under test: a shared machine may take its time
        yield srv, log
    finally:
        srv.stop()


def auc(positives: list[float], negatives: list[float]) -> float:
    """P(a negative's time > a positive's), ties half: the ROC AUC of 'faster means sent'."""
    wins = sum((n > p) + 0.5 * (n == p) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def completion(prompt: list[int]) -> dict:
    return {"model": MODEL_ID, "prompt": prompt, "max_tokens": 1, "temperature": 0}


async def probe(port: int, trials: int, seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(1, 256) for _ in range(n)]

    victim, attacker = Client(port, ANALYTICS_VPCE), Client(port, VOICE_VPCE)
    sent, unsent = [], []
    try:
        for _ in range(trials):
            p, q = fresh(PREFIX), fresh(PREFIX)
            assert (await victim.request("POST", "/v1/completions", completion(p + fresh(8)))).status == 200
            timed = {}
            for name, prefix in rng.sample([("sent", p), ("unsent", q)], 2):
                started = time.perf_counter()
                reply = await attacker.request("POST", "/v1/completions", completion(prefix + fresh(8)))
                timed[name] = time.perf_counter() - started
                assert reply.status == 200
            sent.append(timed["sent"])
            unsent.append(timed["unsent"])
    finally:
        await victim.close()
        await attacker.close()
    return sent, unsent


def cached_tokens(log: Path, since: int) -> list[int]:
    return [json.loads(line)["cached_tokens"] for line in log.read_text().splitlines()[since:]]


def run_probe(server: ServerProcess, log: Path, cfg, trials: int, seed: int) -> tuple[float, list[int]]:
    async def body():
        router = Router.single(MODEL_ID, ("127.0.0.1", server.port))
        h = await start_harness(cfg, router=router, salting=Salting(b"s" * 32, "reference"))
        try:
            return await probe(h.port, trials, seed)
        finally:
            await stop_harness(h)

    since = len(log.read_text().splitlines()) if log.exists() else 0
    sent, unsent = asyncio.run(asyncio.wait_for(body(), 600))
    return auc(sent, unsent), cached_tokens(log, since)


def shared_group_config():
    data = fleet_config().model_dump(mode="json")
    for consumer in data["consumers"]:
        consumer["cache_group"] = "one-team"
    return parse_config(data, "<test config>")


def test_accounts_sharing_a_cache_group_can_time_each_others_prefixes(engine_server):
    """Salting off between them (one group, one salt): the probe works, which shows the probe can see."""
    server, log = engine_server
    score, cached = run_probe(server, log, shared_group_config(), TRIALS_SHARED, seed=1)
    print(f"shared cache group: probe ROC AUC {score:.3f} over {TRIALS_SHARED} trials")
    assert cached.count(PREFIX) == TRIALS_SHARED  # each sent probe found the victim's three blocks
    assert score > 0.9


def test_an_account_timing_its_own_requests_cannot_tell_what_another_account_sent(engine_server):
    server, log = engine_server
    score, cached = run_probe(server, log, fleet_config(), TRIALS_SALTED, seed=2)
    print(f"separate accounts: probe ROC AUC {score:.3f} over {TRIALS_SALTED} trials")
    assert set(cached) == {0}  # no request found a block of the other account's
    assert score < 0.7
