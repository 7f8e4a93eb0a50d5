"""The reference backend imitates the two behaviours of the real GPU stack that the runtime must survive on loopback:
TensorRT-LLM's KV budget rule, and what an MPS server does to its clients when one faults.

KV (TensorRT-LLM 1.2.x, NVIDIA/TensorRT-LLM, as tests/runtime/test_kv_budget.py records): the KV cache is the
smaller of kv_cache_config.max_tokens and free_gpu_memory_fraction x the GPU memory free when the process sizes it,
and that free memory counts every other process on the GPU (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp,
BaseKVCacheManager::calculateMaxNumBlocks, for the TensorRT backend, whose executor KvCacheConfig documents it:
cpp/include/tensorrt_llm/executor/executor.h, mMaxTokens, "If both mMaxTokens and mFreeGpuMemoryFraction are
specified, memory corresponding to the minimum will be allocated"; the LLM API's KvCacheConfig.max_tokens in
tensorrt_llm/llmapi/llm_args.py says the same, index ids 1520735490 and 7019226376 of tests/runtime/trtllm_1_2_llm_args.py;
tensorrt_llm/_torch/pyexecutor/_util.py, KvCacheCreator.configure_kv_cache_capacity, and
tensorrt_llm/_torch/pyexecutor/resource_manager.py, KVCacheManager.calculate_max_num_blocks: "If user also specified a
free gpu memory fraction, take the min", for the PyTorch backend; index id 54765218664). On cpu the reference takes the
"GPU" memory from --sim-gpu-memory-bytes and counts the processes that share one --sim-gpu-ledger.

MPS (NVIDIA MPS documentation, docs.nvidia.com/deploy/mps, "Memory Protection and Error Containment"; Troubleshooting
Guide, "MPS Server Not Accepting New Client Requests"; cudaErrorMpsServerNotReady = 807): a fatal exception in one
client reaches every client of that GPU, and new clients are refused until all of them have exited.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from fleetcast.contract.serving import PROCESS_OVERHEAD_BYTES
from runtime import mps
from runtime.reference.configs import shape_for
from tests.optional import needs_torch

from .reference_helpers import ONE_FORK_SERVER, ROOT, ServerProcess, http_status

pytestmark = [needs_torch, ONE_FORK_SERVER]

MIB = 1 << 20
WEIGHTS = shape_for("tiny").param_count() * 4  # float32 on cpu
MAX_SEQ = 128
SLOT = 2 * 2 * 4 * MAX_SEQ * 16 * 4  # tiny: bytes of one sequence's K and V in every layer


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from runtime.reference.build import build_artifact

    out = tmp_path_factory.mktemp("tiny") / "artifact"
    build_artifact(out, size="tiny", seed=0)
    return out


def memory(srv):
    with urllib.request.urlopen(srv.base + "/memory", timeout=10) as resp:
        return json.loads(resp.read())


def start(artifact, tmp_path, name, *extra, env=None):
    srv = ServerProcess(artifact, "--max-seq-len", str(MAX_SEQ), "--max-batch-size", "64", *extra,
                        log_path=tmp_path / f"{name}.log", env=env)
    return srv


def test_the_kv_budget_is_the_smaller_of_max_tokens_and_the_fraction_of_what_is_free(artifact, tmp_path):
    capacity = 4096 * MIB
    ledger = tmp_path / "ledger"
    sim = ["--sim-gpu-memory-bytes", str(capacity), "--sim-gpu-ledger", str(ledger)]
    first = start(artifact, tmp_path, "first", *sim, "--kv-cache-bytes", str(64 * MIB),
                  "--kv-cache-free-gpu-memory-fraction", "0.9")
    second = third = None
    try:
        first.wait_healthy()
        m1 = memory(first)
        free1 = capacity - WEIGHTS - PROCESS_OVERHEAD_BYTES
        assert m1["free_before_kv_bytes"] == free1
        assert (m1["kv_budget_bytes"], m1["kv_budget_source"]) == (64 * MIB, "--kv-cache-bytes")  # max_tokens binds
        # The second process sees what the first holds (weights, overhead, KV) as used: its fraction of the rest
        # is smaller than its max_tokens, and the smaller one wins: the short KV the runtime must catch.
        second = start(artifact, tmp_path, "second", *sim, "--kv-cache-bytes", str(2048 * MIB),
                       "--kv-cache-free-gpu-memory-fraction", "0.9")
        second.wait_healthy()
        m2 = memory(second)
        free2 = free1 - m1["kv_cache_bytes"] - WEIGHTS - PROCESS_OVERHEAD_BYTES
        assert m2["free_before_kv_bytes"] == free2
        assert (m2["kv_budget_bytes"], m2["kv_budget_source"]) == (int(0.9 * free2), "--kv-cache-free-gpu-memory-fraction")
        assert m2["kv_cache_bytes"] < 2048 * MIB
        second.stop()
        # An MPS client sees at most its pinned limit, less what it holds, as free.
        third = start(artifact, tmp_path, "third", "--sim-gpu-memory-bytes", str(capacity),
                      "--kv-cache-free-gpu-memory-fraction", "0.5",
                      env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": mps.pinned_mem_limit(2048 * MIB)})
        third.wait_healthy()
        assert memory(third)["free_before_kv_bytes"] == capacity - WEIGHTS - PROCESS_OVERHEAD_BYTES  # no daemon: no MPS
    finally:
        for srv in (first, second, third):
            if srv is not None:
                srv.stop()


def test_an_mps_client_sees_its_pinned_limit_as_its_memory(artifact, tmp_path, fake_mps):
    daemon = mps.MpsDaemon(0, tmp_path / "mps")
    daemon.start()
    srv = None
    try:
        env = daemon.client_env(WEIGHTS + PROCESS_OVERHEAD_BYTES + 200 * MIB, None)
        srv = start(artifact, tmp_path, "client", "--sim-gpu-memory-bytes", str(8192 * MIB),
                    "--kv-cache-free-gpu-memory-fraction", "0.5", env=env)
        srv.wait_healthy()
        m = memory(srv)
        assert abs(m["free_before_kv_bytes"] - 200 * MIB) < MIB  # the limit, rounded up to whole MiB, less its own
        assert m["kv_budget_bytes"] == int(0.5 * m["free_before_kv_bytes"])
    finally:
        if srv is not None:
            srv.stop()
        daemon.stop()


def test_a_fault_reaches_every_client_and_new_ones_are_refused_until_all_have_exited(artifact, tmp_path, fake_mps):
    daemon = mps.MpsDaemon(0, tmp_path / "mps")
    daemon.start()
    env = daemon.client_env(None, None)
    a = start(artifact, tmp_path, "a", "--fault-on-signal", env=env)
    b = start(artifact, tmp_path, "b", env=env)
    late = None
    try:
        a.wait_healthy()
        b.wait_healthy()
        a.proc.send_signal(signal.SIGUSR2)
        assert a.proc.wait(timeout=30) == 1  # the faulting client dies
        deadline = time.monotonic() + 30
        while http_status(b.base + "/health", timeout=0.5) == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http_status(b.base + "/health", timeout=0.5) is None  # its neighbour no longer answers...
        assert b.proc.poll() is None  # ...and stays alive
        assert "illegal memory access" in a.log() and "fatal GPU exception" in b.log()
        late = start(artifact, tmp_path, "late", env=env)  # a new client while b lives: refused
        assert late.proc.wait(timeout=60) == 1
        assert "cudaErrorMpsServerNotReady" in late.log()
        b.stop()  # every client of the fault has exited: the server takes clients again
        late = start(artifact, tmp_path, "late2", env=env)
        late.wait_healthy()
    finally:
        for srv in (a, b, late):
            if srv is not None:
                srv.stop()
        daemon.stop()


def test_without_the_flag_sigusr2_is_no_fault_path_and_no_endpoint_exists(artifact, tmp_path):
    """Off by default, and not reachable over HTTP: the fault is a signal only a process on the host can send."""
    out = subprocess.run([sys.executable, "-m", "runtime.reference.server", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert "--fault-on-signal" in out.stdout
    srv = start(artifact, tmp_path, "plain")
    try:
        srv.wait_healthy()
        for path in ("/fault", "/v1/fault", "/debug/fault"):
            assert http_status(srv.base + path) == 404
    finally:
        srv.stop()
