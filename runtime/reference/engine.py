"""Iteration-level batching scheduler over GPT2 + KVCache, with CUDA-graph decode steps.

One background thread owns the model. Each iteration it admits waiting requests into free
cache slots (batched, right-padded prefills, prefix-cache hits among them, which also yield their first tokens),
then runs ONE decode step for every active sequence together, hands each sequence its token, and retires finished
ones.
Active sequences always occupy slots 0..n-1 (a finished sequence's slot is refilled by moving
the last one into it), so a decode step is a fixed-shape batch over the first B rows and can
be a CUDA graph replay: graphs are captured at start-up per (batch bucket, context bucket).

Tokens reach the caller in one batch per delivery point (after each prefill group, after the decode step, after
retiring cancelled sequences): the engine's `deliver` callback gets [(sequence, token_id, finish_reason), ...]
from the engine thread. The server's engine process (worker.py) sends each batch to the HTTP process as one
message; without a `deliver`, each event goes to its `Sequence.emit(token_id, finish_reason)`.

Per sequence and step the engine does no more Python than it must: the rows to sample are chosen in a few
tensor ops for the whole batch and read back once, greedy rows from the step's one top-2 readback
(scripts/bench_step.py times the step's fixed and per-sequence parts).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .configs import TOKENS_PER_BLOCK, kv_blocks_per_slot
from .model import GPT2
from .prefix_cache import PrefixCache, block_keys
from .protocol import SamplingParams, check_request

__all__ = ["Engine", "Events", "SamplingParams", "Sequence", "emit_each"]

log = logging.getLogger("fleetcast.reference.engine")

PREFILL_TOKENS = 8192  # padded prompt tokens per batched prefill (bounds activation memory)
PREFILL_ALIGN = 64  # prefill lengths are padded to a multiple of this


@dataclass
class Sequence:
    """One request's state inside the engine."""

    prompt: list[int]
    params: SamplingParams
    emit: Callable[[int | None, str | None], None] | None = None  # the default delivery's per-sequence callback
    id: int = field(default_factory=lambda: next(_ids))
    submitted: float = field(default_factory=time.monotonic)
    # When an iteration took it from the queue: its queue latency's end. Not the iteration's start, which is stamped
    # before the queue is read, so a request submitted in between would count a negative wait.
    admitted: float = 0.0
    length: int = 0  # positions whose KV is in the cache
    last: int = -1  # last sampled token, fed to the next decode step
    generated: int = 0
    cancelled: bool = False
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    salt: str | None = None  # cache_salt: prefix-cache blocks are shared only with requests of the same salt
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    sink: Any = None  # the deliver callback's own handle (the engine process: the request's id); the engine never reads it


_ids: Iterator[int] = itertools.count(1)

# What the engine delivers, once per delivery point: (sequence, token or None, finish reason or None) each.
Events = list[tuple[Sequence, int | None, str | None]]

# A batched prefill's shape: ("fresh", rows, padded tokens, tokens) for whole prompts (model.prefill_batch), or
# ("hit", rows, new tokens, context) for a batch with prefix-cache hits (model.prefill_batch_from).
Shape = tuple[str, int, int, int]


class IterationObserver(Protocol):
    """What watches each iteration (the TTFT trace, runtime/ttft_trace.py; the shape probe, scripts/probe_prefill.py):
    `begin` at its start (its return comes back to `end`), `end` with the iteration's record once it ran."""

    def begin(self) -> Any: ...

    def end(self, token: Any, record: dict[str, Any]) -> None: ...


def emit_each(events: Events) -> None:
    """The default delivery: each event to its sequence's `emit`."""
    for seq, token, reason in events:
        if seq.emit is not None:
            seq.emit(token, reason)


def _buckets(limit: int, start: int) -> list[int]:
    out, b = [], start
    while b < limit:
        out.append(b)
        b *= 2
    out.append(limit)
    return out


class Engine:
    """Owns the model, the KV cache and the scheduler thread."""

    def __init__(
        self,
        model: GPT2,
        *,
        max_batch_size: int,
        max_seq_len: int,
        vocab_size: int,
        eos_id: int,
        cuda_graphs: bool | None = None,
        stats_keep: int = 1000,
        cache_slots: int | None = None,
        prefix_blocks: int | None = None,
        deliver: Callable[[Events], None] = emit_each,
    ) -> None:
        """`prefix_blocks`: blocks the prefix cache keeps (prefix_cache.py); None: two full sequences' worth,
        0: no block reuse (TensorRT-LLM's kv_cache_config.enable_block_reuse false). `deliver`: called from the
        engine thread with each delivery point's events, in order (the module's docstring)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        if not 2 <= max_seq_len <= model.shape.n_positions:
            raise ValueError(f"max_seq_len: must be between 2 and {model.shape.n_positions}, got {max_seq_len}")
        if cache_slots is not None and cache_slots < 1:
            raise ValueError(f"cache_slots: must be >= 1, got {cache_slots}")
        self.model = model
        # A KV budget (cache_slots) sizes the cache like TensorRT-LLM's KV pool: all of it is
        # allocated, and no more sequences run at once than it holds.
        slots = max_batch_size if cache_slots is None else cache_slots
        max_batch_size = min(max_batch_size, slots)
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.device = model.device
        self.cache = model.new_cache(slots, max_seq_len)
        if prefix_blocks is None:
            prefix_blocks = 2 * max(1, max_seq_len // TOKENS_PER_BLOCK)
        self.prefix = PrefixCache(self.cache, prefix_blocks, TOKENS_PER_BLOCK) if prefix_blocks else None
        self.cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self.batch_buckets = _buckets(max_batch_size, 1)
        self.seq_buckets = _buckets(max_seq_len, min(128, max_seq_len))
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        pin = self.device.type == "cuda"
        self._tokens = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self._host_tokens = torch.zeros(max_batch_size, dtype=torch.long, pin_memory=pin)
        self._host_pos = torch.zeros(max_batch_size, dtype=torch.long, pin_memory=pin)

        self._lock = threading.Condition()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._active: list[Sequence] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self._stats: collections.deque[dict[str, Any]] = collections.deque(maxlen=stats_keep)
        self._iter = 0
        self.failed: BaseException | None = None
        self._deliver_events = deliver
        self._outbox: Events = []
        # Every prefill shape run since start-up, the warm-up's included: a shape not in it pays the first-use costs
        # of its kernels (lazy module loading, library heuristics, the allocator's growth) in a live iteration.
        self.prefill_shapes: set[Shape] = set()
        # Set before start() to watch iterations (off: one `is None` test an iteration and a prefill group).
        self.observer: IterationObserver | None = None
        self._groups: list[dict[str, Any]] | None = None  # the observed iteration's prefill groups
        # Draws for the sampled rows of requests without a seed: one generator for all of them, so they are sampled
        # in one op (their tokens are random either way); a request with a seed draws from its own. Made at the
        # first draw, on the logits' own device (as each request's generator is).
        self._rng: torch.Generator | None = None

    # ---- public API (any thread) -------------------------------------------------------

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ValueError (naming the field) if the request cannot be served."""
        check_request(prompt, params, self.model.shape.vocab_size, self.max_seq_len)

    def submit(self, seq: Sequence) -> None:
        self.submit_all([seq])

    def submit_all(self, seqs: list[Sequence]) -> None:
        """Queue `seqs` at once: the engine's next iteration finds all of them waiting (and admits as many as it has
        free slots), where one submit after another may land on both sides of an iteration's start."""
        for seq in seqs:
            self.validate(seq.prompt, seq.params)
        with self._lock:
            if self._stop:
                raise RuntimeError("engine is stopped")
            self._waiting.extend(seqs)
            self._lock.notify()

    def cancel(self, seq: Sequence) -> None:
        """Stop generating for `seq` (its client went away); it is retired at the next iteration."""
        seq.cancelled = True
        with self._lock:
            self._lock.notify()

    def load(self) -> dict[str, int]:
        with self._lock:
            return {"active": len(self._active), "queued": len(self._waiting)}

    def pop_stats(self) -> list[dict[str, Any]]:
        """Iteration stats gathered since the last call (dequeued, like trtllm-serve's /metrics)."""
        with self._lock:
            out = list(self._stats)
            self._stats.clear()
        return out

    def start(self, grid: bool | None = None) -> None:
        """Warm up (`grid`: warm_up's), capture the decode graphs, start the scheduler thread."""
        self.warm_up(grid)
        if self.cuda_graphs:
            self.capture_graphs()
        self._thread = threading.Thread(target=self._run, name="reference-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- decode step ---------------------------------------------------------------------

    def _decode_eager(self, B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.decode(self.cache, self._tokens[:B], self._pos[:B], L)
        # Top-2 over the tokenizer's ids: the second choice replaces EOS when EOS is suppressed.
        top2 = torch.topk(logits[:, : self.vocab_size], 2, dim=-1).indices
        return logits, top2

    def warmup_shapes(self, grid: bool) -> list[Shape]:
        """The prefill shapes warm_up runs, on both paths (whole prompts; prefix-cache hits): one row per padded
        length, and with `grid` every batch bucket of rows at each padded length that fits a prefill
        (rows x length <= PREFILL_TOKENS, rows <= the cache's slots), so at most len(batch buckets) x lengths x 2.

        Why rows too: a batch's rows multiply the token dimension of every GEMM and the attention's batch, which
        selects other kernels (each loaded at its first use) and grows the allocator's pool. TensorRT-LLM's PyTorch
        backend warms the same two ends before serving: one token and its max_num_tokens of pure context, the max
        batch of pure generation (model_engine.py, _general_warmup), a forward at max_num_tokens for the autotuner
        (_run_autotuner_warmup), and a CUDA graph per batch size (_capture_generation_cuda_graphs); its trtllm-build
        engines are built for optimization profiles over batch and tokens. Largest first, so the allocator's biggest
        blocks exist before the smaller shapes split them (its piecewise CUDA graph warm-up ends on the batch "with
        most requests" for the same reason)."""
        lengths = sorted({self._aligned(n) for n in range(PREFILL_ALIGN, self.max_seq_len + PREFILL_ALIGN, PREFILL_ALIGN)})
        slots = min(self.cache.max_batch, self.max_batch_size)
        rows = [b for b in self.batch_buckets if b <= slots] if grid else [1]
        shapes: list[Shape] = []
        for n in lengths:
            for r in rows:
                if r == 1 or r * n <= PREFILL_TOKENS:
                    shapes += [("fresh", r, n, n), ("hit", r, n, n)]
        return sorted(shapes, key=lambda shape: -shape[1] * shape[2])

    def warm_up(self, grid: bool | None = None) -> None:
        """Run every shape of warmup_shapes before serving, so library heuristics, lazy kernel loading and the
        allocator's growth are not paid by the first clients (seen on the H200: 90 ms first TTFT). `grid`: the
        rows of every batch bucket too; by default on a GPU only (a CPU loads no kernels lazily)."""
        if grid is None:
            grid = self.device.type == "cuda"
        with torch.inference_mode():
            for kind, rows, n, context in self.warmup_shapes(grid):
                ids = torch.zeros(rows, n, dtype=torch.long, device=self.device)
                if kind == "fresh":
                    self.model.prefill_batch(self.cache, 0, ids, torch.full((rows,), n, device=self.device))
                else:
                    self.model.prefill_batch_from(self.cache, 0, ids, [0] * rows, [n] * rows, context)
                self.prefill_shapes.add((kind, rows, n, context))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.cache.kv.zero_()

    def capture_graphs(self) -> None:
        """Capture one decode graph per (batch bucket, context bucket). Only at start-up: the
        warm-up runs write KV rows, which must not belong to live sequences."""
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        started = time.monotonic()
        side = torch.cuda.Stream()
        for B in self.batch_buckets:
            for L in self.seq_buckets:
                self._tokens.zero_()
                self._pos.zero_()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self._decode_eager(B, L)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits, top2 = self._decode_eager(B, L)
                self._graphs[(B, L)] = (graph, logits, top2)
        torch.cuda.synchronize()
        self.cache.kv.zero_()
        log.info("captured %d decode graphs in %.2fs", len(self._graphs), time.monotonic() - started)

    def bucket(self, n: int, max_pos: int) -> tuple[int, int]:
        B = next(b for b in self.batch_buckets if b >= n)
        L = next(s for s in self.seq_buckets if s > max_pos)
        return B, L

    def decode_step(self, tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Decode one token for slots 0..n-1; return (logits [>=n, V], [(top1, top2)] per row)."""
        n = len(tokens)
        if self.cuda_graphs:
            B, L = self.bucket(n, max(positions))
        else:
            B, L = n, max(positions) + 1
        self._host_tokens[:n] = torch.tensor(tokens, dtype=torch.long)
        self._host_pos[:n] = torch.tensor(positions, dtype=torch.long)
        self._host_tokens[n:B] = 0
        self._host_pos[n:B] = 0  # padding rows write KV into free slots only
        self._tokens[:B].copy_(self._host_tokens[:B], non_blocking=True)
        self._pos[:B].copy_(self._host_pos[:B], non_blocking=True)
        if self.cuda_graphs:
            graph, logits, top2 = self._graphs[(B, L)]
            graph.replay()
        else:
            logits, top2 = self._decode_eager(B, L)
        pairs = top2[:n].tolist()
        return logits, [(a, b) for a, b in pairs]

    # ---- scheduler -----------------------------------------------------------------------

    def _suppress_eos(self, seq: Sequence) -> bool:
        return seq.params.ignore_eos or seq.generated < seq.params.min_tokens

    def _choose_rows(self, seqs: list[Sequence], logits: torch.Tensor, tops: list[Any]) -> list[int]:
        """The next token of each of `seqs`, whose row i of `logits` [>= n, V] and `tops` (its top-2 ids) are
        seqs[i]'s. Greedy rows take their top-2 readback, with no tensor op of their own; sampled rows are sampled
        together (_sample)."""
        eos, out, sampled = self.eos_id, [], []
        for i, seq in enumerate(seqs):
            if seq.params.temperature <= 0:
                first, second = tops[i][0], tops[i][1]
                out.append(second if first == eos and self._suppress_eos(seq) else first)
            else:
                out.append(-1)
                sampled.append(i)
        if sampled:
            for i, token in zip(sampled, self._sample([seqs[i] for i in sampled], logits, sampled), strict=True):
                out[i] = token
        return out

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor, rows: list[int]) -> list[int]:
        """Sample one token for each of `seqs` (rows `rows` of `logits`) in a few ops for all of them and one readback.

        The same tokens as one torch.multinomial(probs, 1, generator=...) per row: for one sample, aten's multinomial
        takes argmax(probs / q) with q ~ Exp(1) drawn by `exponential_` on a tensor of probs' shape, on every device
        (aten/src/ATen/native/Distributions.cpp, multinomial), which is what this does per row, a seeded request
        drawing from its own generator as before (tests/runtime/test_reference_engine.py compares the two)."""
        n, V, inf = len(seqs), self.vocab_size, float("-inf")
        picked = logits[:n] if rows[-1] == n - 1 else logits[torch.tensor(rows, device=logits.device)]
        temps = {s.params.temperature for s in seqs}
        if len(temps) == 1:
            scores = picked[:, :V].float() / temps.pop()
        else:
            scores = picked[:, :V].float() / torch.tensor([[s.params.temperature] for s in seqs], device=logits.device)
        suppress = [j for j, s in enumerate(seqs) if self._suppress_eos(s)]
        if len(suppress) == n:  # a slice: no index tensor to build (and copy to the device)
            scores[:, self.eos_id] = inf
        elif suppress:
            scores[suppress, self.eos_id] = inf
        for j, s in enumerate(seqs):
            if 0 < s.params.top_k < V:
                row = scores[j]
                row.masked_fill_(row < torch.topk(row, s.params.top_k).values[-1], inf)
        probs = scores.softmax(-1)
        noise = torch.empty_like(probs)
        unseeded = []
        for j, s in enumerate(seqs):
            if s.params.top_p < 1.0:
                sorted_p, order = probs[j].sort(descending=True)
                drop = sorted_p.cumsum(-1) - sorted_p > s.params.top_p
                probs[j] = probs[j].scatter(0, order, sorted_p.masked_fill(drop, 0.0))
            if s.params.seed is None:
                unseeded.append(j)
                continue
            if s.generator is None:
                s.generator = torch.Generator(device=probs.device)
                s.generator.manual_seed(s.params.seed)
            noise[j].exponential_(1, generator=s.generator)
        if unseeded and self._rng is None:
            self._rng = torch.Generator(device=probs.device)
            self._rng.seed()
        if len(unseeded) == n:
            noise.exponential_(1, generator=self._rng)
        elif unseeded:
            noise[unseeded] = torch.empty(len(unseeded), V, device=probs.device).exponential_(1, generator=self._rng)
        chosen: list[int] = (probs / noise).argmax(-1).tolist()
        return chosen

    def _deliver(self, seq: Sequence, token: int) -> bool:
        """Record `token` for `seq`, queue it for delivery; return True if the sequence is finished."""
        seq.last = token
        seq.generated += 1
        reason = None
        if token == self.eos_id and not self._suppress_eos(seq):
            reason = "stop"
        elif seq.generated >= seq.params.max_tokens:
            reason = "length"
        seq.finish_reason = reason
        self._outbox.append((seq, token, reason))
        return reason is not None

    def _retire(self, seq: Sequence, reason: str) -> None:
        if seq.finish_reason is None:
            seq.finish_reason = reason
            self._outbox.append((seq, None, reason))

    def _flush(self) -> None:
        """Deliver what was queued since the last delivery point, in one call."""
        if self._outbox:
            events, self._outbox = self._outbox, []
            self._deliver_events(events)

    def _admit(self, seqs: list[Sequence]) -> int:
        """Prefill `seqs` into the next free slots, in arrival order, in batches of at most PREFILL_TOKENS padded
        new tokens; each gets its first token. Return how many finished at once (or were cancelled).

        Prefix-cache hits and misses batch alike: a hit's cached blocks are loaded into its slot and only the
        rest of its prompt runs, in the same forward as the others (model.prefill_batch_from), so an iteration
        that admits many hits costs one forward, one top-2 and one delivery, not one of each per hit. Every
        match is made before any store, and the admitted prompts' new blocks are stored after all of them ran:
        as in TensorRT-LLM, a request's blocks become reusable from the next iteration, never to another
        request of its own (tests/runtime/trtllm_1_2_scheduler.py), and no store can evict a block matched
        here before it is loaded."""
        finished = 0
        live: list[tuple[Sequence, list[bytes], list[int]]] = []  # each with its block keys and matched pool rows
        for seq in seqs:
            if seq.cancelled:
                self._retire(seq, "cancelled")
                finished += 1
                continue
            keys: list[bytes] = []
            rows: list[int] = []
            if self.prefix is not None:
                keys = block_keys(seq.prompt, seq.salt, TOKENS_PER_BLOCK)
                rows = self.prefix.match(keys, len(seq.prompt))
            seq.cached_tokens = len(rows) * TOKENS_PER_BLOCK
            live.append((seq, keys, rows))
        self._flush()
        first_slot = len(self._active)
        pending = collections.deque(live)
        done: list[int] = []  # slots of the ones that finished on their first token, retired once all ran
        while pending:
            group = [pending.popleft()]
            while pending and (len(group) + 1) * self._padded([*(g[0] for g in group), pending[0][0]]) <= PREFILL_TOKENS:
                group.append(pending.popleft())
            first = len(self._active)
            batch = [seq for seq, _, _ in group]
            T = self._padded(batch)
            ids = torch.zeros(len(group), T, dtype=torch.long)
            for row, seq in enumerate(batch):
                ids[row, : len(seq.prompt) - seq.cached_tokens] = torch.tensor(seq.prompt[seq.cached_tokens:],
                                                                                dtype=torch.long)
            group_at = time.monotonic() if self._groups is not None else 0.0
            if any(seq.cached_tokens for seq in batch):
                assert self.prefix is not None
                self.prefix.load([(first + row, rows) for row, (_, _, rows) in enumerate(group)], self.cache)
                end = max(len(seq.prompt) for seq in batch)
                shape: Shape = ("hit", len(batch), T, end)
                logits = self.model.prefill_batch_from(
                    self.cache, first, ids.to(self.device), [seq.cached_tokens for seq in batch],
                    [len(seq.prompt) - seq.cached_tokens for seq in batch], end)
            else:
                shape = ("fresh", len(batch), T, T)
                lengths = torch.tensor([len(s.prompt) for s in batch], dtype=torch.long)
                logits = self.model.prefill_batch(self.cache, first, ids.to(self.device), lengths.to(self.device))
            tops = torch.topk(logits[:, : self.vocab_size], 2, dim=-1).indices.tolist()
            new = shape not in self.prefill_shapes
            if new:
                self.prefill_shapes.add(shape)
            if self._groups is not None:  # the readback above waited for the group's forward: its time is whole
                self._groups.append({"shape": list(shape), "new": new,
                                     "ms": round((time.monotonic() - group_at) * 1000, 3)})
            # Every prompt of the group holds a slot now; ones that finish on their first token
            # are retired through _remove once all groups ran, so the slots stay contiguous.
            for seq in batch:
                seq.length = len(seq.prompt)
                self._active.append(seq)
            chosen = self._choose_rows(batch, logits, tops)
            done += [first + row for row, (seq, token) in enumerate(zip(batch, chosen, strict=True))
                     if self._deliver(seq, token)]
            self._flush()  # the group's first tokens go out now, not after the rest of the iteration
        if self.prefix is not None:
            for offset, (_, keys, rows) in enumerate(live):
                self.prefix.store(keys, self.cache, first_slot + offset, len(rows))
        for index in reversed(done):
            self._remove(index)
        return finished + len(done)

    def _padded(self, seqs: list[Sequence]) -> int:
        """Prefill length for `seqs`: the longest part still to compute (the prompt less its cached prefix), rounded
        up for whole prompts only. A batch with a prefix-cache hit runs exactly its longest rest, as one hit's
        prefill always did: rounding a hit's few tokens up to PREFILL_ALIGN would multiply its work (on a CPU, by
        8 for 8 tokens), and that gap is what a hit saves."""
        longest = max(len(s.prompt) - s.cached_tokens for s in seqs)
        return longest if any(s.cached_tokens for s in seqs) else self._aligned(longest)

    def _aligned(self, n: int) -> int:
        """`n` rounded up to PREFILL_ALIGN, so the library kernels see a few recurring shapes (each new shape paid
        10-30 ms on the H200)."""
        return min(-(-n // PREFILL_ALIGN) * PREFILL_ALIGN, self.max_seq_len)

    def _remove(self, index: int) -> None:
        """Retire active[index], moving the last active sequence into its slot."""
        last = len(self._active) - 1
        if index != last:
            moved = self._active[last]
            self.cache.move(last, index, moved.length)
            self._active[index] = moved
        self._active.pop()

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                self._loop()
        except BaseException as exc:  # the server turns this into 503s and a non-zero exit
            log.exception("engine thread failed")
            self.failed = exc
            with self._lock:
                self._stop = True  # submit() refuses from now on instead of queueing forever
                pending = list(self._waiting) + self._active
                self._waiting.clear()
                self._active.clear()
            for seq in pending:
                self._retire(seq, "error")
            self._flush()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._waiting and not self._active:
                    self._lock.wait()
                if self._stop:
                    pending = list(self._waiting) + self._active
                    self._waiting.clear()
                    self._active.clear()
                    break
            started = time.monotonic()
            observer = self.observer
            if observer is not None:
                watch, self._groups = observer.begin(), []
            # Cancelled sequences leave before the batch is filled: the gateway counted a slot free when its
            # client left, and the request it admitted into it must start in this iteration, not wait one
            # behind a batch that only looks full.
            completed = self._retire_cancelled()
            with self._lock:
                free = self.max_batch_size - len(self._active)
                admitted = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                queued = len(self._waiting)
                taken = time.monotonic()
            for s in admitted:
                s.admitted = taken
            queue_latency = sum(taken - s.submitted for s in admitted) / len(admitted) if admitted else 0.0
            ctx_tokens = sum(len(s.prompt) for s in admitted)
            completed += self._admit(admitted)
            # Cancelled while being admitted: they leave before the step, so they cost no decode.
            completed += self._retire_cancelled()
            n_gen = len(self._active)
            decode_at = time.monotonic() if observer is not None else 0.0
            if self._active:
                tokens = [s.last for s in self._active]
                positions = [s.length for s in self._active]
                logits, tops = self.decode_step(tokens, positions)
                finished = []
                for i, (seq, token) in enumerate(zip(self._active, self._choose_rows(self._active, logits, tops),
                                                     strict=True)):
                    seq.length += 1
                    if self._deliver(seq, token):
                        finished.append(i)
                self._flush()
                for i in reversed(finished):
                    self._remove(i)
                completed += len(finished)
            self._record(started, admitted, queue_latency, completed, ctx_tokens, n_gen, queued)
            if observer is not None:
                groups, self._groups = self._groups, None
                observer.end(watch, {"start": started, "decode_at": decode_at, "end": time.monotonic(),
                                     "admitted": len(admitted), "active": n_gen, "groups": groups})
        for seq in pending:
            self._retire(seq, "cancelled")
        self._flush()

    def _retire_cancelled(self) -> int:
        """Retire the active sequences whose clients went away; how many."""
        retired = 0
        for i in range(len(self._active) - 1, -1, -1):
            if self._active[i].cancelled:
                self._retire(self._active[i], "cancelled")
                self._remove(i)
                retired += 1
        self._flush()
        return retired

    def _gpu_memory(self) -> int:
        """Bytes the caching allocator has handed out on the engine's device (0 off a GPU), for every iteration's
        stats. Read from the allocator's nested stats, not torch.cuda.memory_allocated: that one flattens every stat
        through a closure that refers to itself (torch/cuda/memory.py, memory_stats), a cycle of about 125 objects
        (the stats' tuples, its list, cells and functions) per call, which only the garbage collector frees: an
        iteration's worth of cyclic garbage, the 2,570 objects the engine process freed a young collection on the
        H100 (bench/FAIRNESS_DEVICE.md, "Call 4 as run")."""
        if self.device.type != "cuda":
            return 0
        allocated = torch.cuda.memory_stats_as_nested_dict(self.device).get("allocated_bytes", {})
        return int(allocated.get("all", {}).get("current", 0))

    def _record(self, started: float, admitted: list[Sequence], queue_latency: float, completed: int, ctx_tokens: int,
                n_gen: int, queued: int) -> None:
        self._iter += 1
        now = time.time()
        max_blocks = self.cache.max_batch * kv_blocks_per_slot(self.max_seq_len)
        used = sum(-(-s.length // TOKENS_PER_BLOCK) for s in self._active)
        gpu_mem = self._gpu_memory()
        stat = {
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S", time.gmtime(now)),
            "iter": self._iter,
            "iterLatencyMS": (time.monotonic() - started) * 1000.0,
            "newActiveRequestsQueueLatencyMS": queue_latency * 1000.0,
            "numActiveRequests": len(self._active),
            "numNewActiveRequests": len(admitted),
            "numCompletedRequests": completed,
            "numQueuedRequests": queued,
            "maxNumActiveRequests": self.max_batch_size,
            "maxBatchSizeStatic": self.max_batch_size,
            "gpuMemUsage": gpu_mem,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": max_blocks,
                "freeNumBlocks": max_blocks - used,
                "usedNumBlocks": used,
                "tokensPerBlock": TOKENS_PER_BLOCK,
                "allocTotalBlocks": used,
                "allocNewBlocks": 0,
                "reusedBlocks": 0,
                "missedBlocks": 0,
                "cacheHitRate": 0.0,
                **(self.prefix.stats() if self.prefix is not None else {}),
            },
            "inflightBatchingStats": {
                "numScheduledRequests": len(admitted) + n_gen,
                "numContextRequests": len(admitted),
                "numGenRequests": n_gen,
                "numPausedRequests": 0,
                "numCtxTokens": ctx_tokens,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0 if n_gen else 0.0,
            },
        }
        with self._lock:
            self._stats.append(stat)
