"""After start, each process's KV cache is checked against its plan, and a short one is named.

TensorRT-LLM 1.2.x takes min(kv_cache_config.max_tokens, free_gpu_memory_fraction x the memory free when the process
starts), the free memory counting the other processes (tests/runtime/test_kv_budget.py and
test_reference_mps_and_kv.py cite the sources: kvCacheManager.cpp calculateMaxNumBlocks, executor.h KvCacheConfig,
_torch/pyexecutor/_util.py configure_kv_cache_capacity, _torch/pyexecutor/resource_manager.py
KVCacheManager.calculate_max_num_blocks, whose `blocks_in_primary_pool = int(max_tokens // tokens_per_block)` rounds
down: a process one block under its max_tokens is as planned). The check reads what the engine reports on /metrics
(kvCacheStats maxNumBlocks x tokensPerBlock: cpp/tensorrt_llm/executor/jsonSerialization.cpp, KvCacheStats), which the
reference backend reports the same way. Here two reference processes share one simulated GPU; with a fraction that
leaves the second short of its budget (the regression: the fraction, not max_tokens, binds) it is named; with the
binding fraction the runtime gives budgeted processes, both come out as planned.
"""

from __future__ import annotations

import sys

import pytest

from fleetcast.config.memory import binding_fraction
from runtime import kv_budget
from runtime.devtools.harness import free_port
from runtime.reference.configs import kv_tokens, shape_for
from runtime.serve import ServerProcess, ServeSettings, Serving, server_name
from runtime.supervisor import RestartPolicy
from tests.optional import needs_torch

pytestmark = [needs_torch, pytest.mark.usefixtures("forked_engines")]

MIB = 1 << 20
MAX_SEQ = 128
SHAPE = shape_for("tiny")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from runtime.reference.build import build_artifact

    out = tmp_path_factory.mktemp("tiny") / "artifact"
    build_artifact(out, size="tiny", seed=0)
    return out


def run(artifact, tmp_path, fraction: float, budgets: dict[str, int], capacity: int):
    servers = []
    for model, budget in budgets.items():
        port = free_port()
        servers.append(ServerProcess(
            name=server_name(model, 0, single=False), model_id=model, copy_index=0, port=port,
            argv=[sys.executable, "-m", "runtime.reference.server", "--artifact", str(artifact), "--host", "127.0.0.1",
                  "--port", str(port), "--served-model-name", model, "--max-seq-len", str(MAX_SEQ),
                  "--max-batch-size", "8", "--threads", "1", "--kv-cache-bytes", str(budget),
                  "--kv-cache-free-gpu-memory-fraction", str(fraction), "--sim-gpu-memory-bytes", str(capacity),
                  "--sim-gpu-ledger", str(tmp_path / "ledger")],
            kv_cache_bytes=budget, kv_tokens_planned=kv_tokens(budget, SHAPE, MAX_SEQ, 4)))
    settings = ServeSettings(port=free_port(), model_name=servers[0].model_id, region="r", pool="p", gateway=False,
                             ready_timeout_s=120, restart=RestartPolicy(max_restarts=1, backoff_base_s=0.1),
                             liveness_interval_s=5, liveness_timeout_s=10)
    s = Serving(settings, servers=servers)
    s.start()
    try:
        return s.wait_ready()
    finally:
        s.drain()


def test_a_process_whose_kv_came_out_short_is_named(artifact, tmp_path):
    weights = SHAPE.param_count() * 4
    overhead = kv_budget.PROCESS_OVERHEAD_BYTES
    # Room on the "GPU" for both processes and their budgets, 20% to spare; the second starts after the first holds
    # its share, and a quarter of what is then free (0.25 x ~836 MiB) is less than its budget (256 MiB).
    budgets = {"alpha": 256 * MIB, "beta": 256 * MIB}
    capacity = int(1.2 * (2 * (weights + overhead) + sum(budgets.values())))
    timings = run(artifact, tmp_path / "short", 0.25, budgets, capacity)
    short = timings.get("kv_short", {})
    assert list(short) == [server_name("beta", 0, single=False)]
    assert short[server_name("beta", 0, single=False)]["planned_tokens"] == kv_tokens(256 * MIB, SHAPE, MAX_SEQ, 4)
    assert short[server_name("beta", 0, single=False)]["tokens"] < short[server_name("beta", 0, single=False)]["planned_tokens"]
    # The fraction the runtime gives a budgeted process: both bind, in this order as in the other.
    kv_budget.check_budgets_bind([type("S", (), {"model_id": m, "copy_index": 0})() for m in budgets],
                                 {(m, 0): b for m, b in budgets.items()}, {m: weights for m in budgets}, capacity,
                                 binding_fraction())
    for order in (budgets, dict(reversed(budgets.items()))):
        timings = run(artifact, tmp_path / f"bind-{next(iter(order))}", binding_fraction(), order, capacity)
        assert "kv_short" not in timings
