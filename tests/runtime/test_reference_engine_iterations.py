"""runtime.reference.engine: the shapes it warms before serving, what an iteration leaves for the collector, and
what it tells an iteration observer (the TTFT trace's IterationWatch, scripts/probe_prefill.py)."""

from __future__ import annotations

import gc
import threading

import pytest

from runtime.reference.build import random_weights
from runtime.reference.configs import shape_for
from runtime.reference.tokenizer import EOS_ID, VOCAB_SIZE
from tests.optional import needs_torch
from tests.runtime import trtllm_1_2_warmup as trtllm

SHAPE = shape_for("tiny")

pytestmark = [needs_torch, pytest.mark.xdist_group("torch-in-process")]


@pytest.fixture(scope="module", autouse=True)
def _engine_modules():
    global torch, engine_module, Engine, SamplingParams, Sequence, GPT2
    import torch

    import runtime.reference.engine as engine_module
    from runtime.reference.engine import Engine, SamplingParams, Sequence
    from runtime.reference.model import GPT2


@pytest.fixture(scope="module")
def model():
    return GPT2(SHAPE, random_weights(SHAPE, seed=5))


def make_engine(model, **kw) -> Engine:
    kw.setdefault("max_batch_size", 8)
    return Engine(model, max_seq_len=SHAPE.n_positions, vocab_size=VOCAB_SIZE, eos_id=EOS_ID, cuda_graphs=False, **kw)


class Recorder:
    """An IterationObserver that keeps every record."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.begun = 0

    def begin(self) -> int:
        self.begun += 1
        return self.begun

    def end(self, token: int, record: dict) -> None:
        self.records.append({**record, "token": token})


def serve(engine: Engine, prompts: list[list[int]], salt: str | None = None) -> None:
    """Submit `prompts` at once (one iteration admits them all) and wait for every one to finish."""
    done = threading.Event()
    left = [len(prompts)]

    def emit(token, reason):
        if reason is not None:
            left[0] -= 1
            if not left[0]:
                done.set()

    engine.submit_all([Sequence(prompt=p, params=SamplingParams(max_tokens=2, ignore_eos=True), emit=emit, salt=salt)
                       for p in prompts])
    assert done.wait(30)


def test_the_warm_up_runs_every_batch_bucket_at_every_padded_length_that_fits_a_prefill_on_both_paths(model):
    engine = make_engine(model, max_batch_size=8)
    engine.warm_up(grid=True)
    lengths = [64, 128, 192, 256]
    want = {(kind, rows, n, n) for kind in ("fresh", "hit") for n in lengths for rows in (1, 2, 4, 8)
            if rows == 1 or rows * n <= engine_module.PREFILL_TOKENS}
    assert engine.prefill_shapes == want
    # TensorRT-LLM warms its largest context batch first (trtllm_1_2_warmup: the allocator's biggest blocks first).
    assert trtllm.WARMS_THE_LARGEST_CONTEXT_BATCH
    shapes = engine.warmup_shapes(grid=True)
    assert shapes[0][1] * shapes[0][2] == max(rows * n for _, rows, n, _ in shapes)


def test_the_warm_up_grid_stays_within_the_prefill_token_bound_and_the_cache_slots(model, monkeypatch):
    monkeypatch.setattr(engine_module, "PREFILL_TOKENS", 1024)
    engine = make_engine(model, max_batch_size=64, cache_slots=16)
    shapes = engine.warmup_shapes(grid=True)
    assert {rows for _, rows, _, _ in shapes} == {1, 2, 4, 8, 16}  # no bucket past the 16 slots
    assert all(rows == 1 or rows * n <= 1024 for _, rows, n, _ in shapes)
    assert ("fresh", 8, 128, 128) in shapes and ("fresh", 16, 128, 128) not in shapes
    assert ("hit", 1, 256, 256) in shapes  # one row of every padded length, whatever the bound


def test_on_a_cpu_the_default_warm_up_runs_one_row_per_padded_length(model):
    engine = make_engine(model)
    engine.warm_up()
    assert {rows for _, rows, _, _ in engine.prefill_shapes} == {1}


def test_a_live_batch_of_a_warmed_shape_is_not_new_and_one_of_another_row_count_is(model):
    engine = make_engine(model, max_batch_size=8, prefix_blocks=0)
    engine.warm_up(grid=True)
    recorder = Recorder()
    engine.observer = recorder
    engine.start()
    try:
        serve(engine, [[7] * 100] * 4)  # 4 rows padded to 128: a warmed bucket
        serve(engine, [[9] * 100] * 3)  # 3 rows: no bucket
    finally:
        engine.stop()
    groups = [g for r in recorder.records for g in r["groups"]]
    assert [(g["shape"], g["new"]) for g in groups] == [(["fresh", 4, 128, 128], False), (["fresh", 3, 128, 128], True)]
    assert all(g["ms"] >= 0 for g in groups)


def test_the_observer_gets_each_iteration_with_its_admitted_count_groups_and_decode_start(model):
    engine = make_engine(model)
    recorder = Recorder()
    engine.observer = recorder
    engine.start()
    try:
        serve(engine, [[5] * 70], salt="a")
        serve(engine, [[5] * 70, [5] * 70], salt="a")  # both hit the first's block: one prefix-hit batch
    finally:
        engine.stop()
    admitting = [r for r in recorder.records if r["admitted"]]
    assert [r["admitted"] for r in admitting] == [1, 2]
    assert admitting[1]["groups"][0]["shape"] == ["hit", 2, 6, 70]  # 64 of 70 tokens cached: 6 new, context 70
    assert all(r["start"] <= r["decode_at"] <= r["end"] for r in recorder.records)
    assert [r["token"] for r in recorder.records] == list(range(1, recorder.begun + 1))


def test_without_an_observer_an_iteration_records_no_groups(model):
    engine = make_engine(model)
    engine.start()
    try:
        serve(engine, [[3] * 10])
    finally:
        engine.stop()
    assert engine._groups is None and engine.prefill_shapes  # the shapes' set is kept; nothing else is


def test_the_iteration_stats_leave_no_cyclic_garbage_on_the_gpu_path(model):
    """torch.cuda.memory_allocated flattens the allocator's stats through a self-referencing closure: a cycle per
    call, one per iteration, the engine process's young collections on the H100 (bench/FAIRNESS_DEVICE.md). The
    stats' GPU branch runs on a CPU too (no CUDA initialised: the allocator reports nothing)."""
    engine = make_engine(model)
    engine.device = torch.device("cuda")
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            engine._record(0.0, [], 0.0, 0, 0, 0, 0)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert engine.pop_stats()[-1]["gpuMemUsage"] == 0


def test_serving_leaves_no_cyclic_garbage_once_warm(model):
    engine = make_engine(model)
    engine.start()
    try:
        serve(engine, [[4] * 70, [6] * 20], salt="s")
        gc.collect()
        gc.disable()
        try:
            serve(engine, [[4] * 70, [6] * 20, [8] * 30], salt="s")
            assert gc.collect() == 0
        finally:
            gc.enable()
    finally:
        engine.stop()


def test_a_request_submitted_after_an_iteration_began_but_before_it_read_the_queue_waited_no_negative_time(model):
    """The iteration's start is stamped before its queue is read (its cancelled sequences leave first), and a request
    submitted in between is taken by that iteration: its wait ends when it is taken, not when the iteration began.
    Before, its queue latency (`newActiveRequestsQueueLatencyMS`, trtllm-serve's field, a wait) came out negative,
    and so did the TTFT trace's `engine_queue` hop (-0.13 ms once in a loopback bench run)."""
    engine = make_engine(model)
    finished = threading.Semaphore(0)

    def sequence(max_tokens: int):
        return Sequence(prompt=[7] * 9, params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                        emit=lambda token, reason: reason is not None and finished.release())

    late: list = []

    class SubmitsAtBegin(Recorder):
        def begin(self) -> int:
            if self.begun == 1:  # the second iteration's: the first admitted the long sequence alone
                late.append(sequence(1))
                engine.submit_all(late)
            return super().begin()

    engine.observer = SubmitsAtBegin()
    engine.start()
    try:
        engine.submit_all([sequence(6)])
        assert finished.acquire(timeout=30) and finished.acquire(timeout=30)
        stats = engine.pop_stats()
    finally:
        engine.stop()
    admitting = [s for s in stats if s["numNewActiveRequests"]]
    assert len(admitting) == 2 and all(s["newActiveRequestsQueueLatencyMS"] >= 0 for s in admitting)
    assert late[0].admitted >= late[0].submitted > 0
