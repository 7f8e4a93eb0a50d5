"""The reference server's engine process: the model, the KV cache and the engine's step loop, apart from HTTP.

Why a process of its own: in one process the HTTP event loop (a task wake-up, the SSE encoding and a socket write
per token and stream) and the engine's step loop share one interpreter lock, so every stream's per-token Python
lands in the step's time, and the step grows with the batch (docs/gateway.md, "The reference engine's step per
sequence"). trtllm-serve keeps them apart the same way: its OpenAI server (tensorrt_llm/serve/openai_server.py)
holds an LLM whose GenerationExecutorProxy (tensorrt_llm/executor/proxy.py) starts the executor's `worker_main` in
processes of their own and talks to them over IPC queues: requests and CancellingRequest (abort_request) one way;
the other way each batch of responses as one message (the worker's handle_for_ipc_batched: "Perform the IPC in
batch explicitly", one result_queue.put of the batch), which the proxy's dispatch thread hands to every request's
queue with one wake-up of the event loop (_SyncQueue.notify_many); iteration stats are fetched on demand
(get_stats). Sources: NVIDIA/TensorRT-LLM, 1.1/1.2 line, stored index ids 3493716097 (executor/proxy.py) and
1131391427 (the worker's response handling); tests/runtime/test_reference_worker.py names them.

Started by the HTTP process (proxy.EngineProxy) as `python -m runtime.reference.worker` with the channel
(protocol.py) as its standard input. It stays in its parent's session and process group (the supervisor counts a
session's CPU as a starting server's progress and kills a frozen server's whole group, runtime/supervisor.py),
leaves SIGTERM and SIGINT to its parent (the drain is the HTTP process's; it ends with STOP), and dies with its
parent: PR_SET_PDEATHSIG (prctl(2)) kills it when the parent dies, and the channel's end of file does too.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetcast.contract.serving import GIB

from ..heap import serve_gc_policy
from ..ttft_trace import IterationWatch, Trace, tracer
from . import protocol as p
from .mps_sim import MpsClientSim

if TYPE_CHECKING:
    from .engine import Engine, Events, Sequence

log = logging.getLogger("fleetcast.reference.worker")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# None unless the test switch is on (runtime/ttft_trace.py); read in main, not at import (a fork's environment is
# its own: tests/runtime/test_zygote.py).
TRACE: Trace | None = None


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent dies (prctl(2) PR_SET_PDEATHSIG; Linux only, else nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def pinned_limit(value: str | None) -> int | None:
    """Bytes of device 0's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=1024M", suffixes G, M, K or none), or None."""
    for part in (value or "").split(","):
        device, _, limit = part.strip().partition("=")
        if device.strip() != "0" or not limit:
            continue
        scale = {"G": GIB, "M": GIB >> 10, "K": GIB >> 20}.get(limit[-1].upper(), 1)
        digits = limit[:-1] if scale != 1 else limit
        try:
            return int(float(digits) * scale)
        except ValueError:
            return None
    return None


class EngineHost:
    """Loads the artifact into an Engine and serves the channel: requests in, each delivery point's tokens out."""

    def __init__(self, args: argparse.Namespace, channel: socket.socket) -> None:
        self.args = args
        self.channel = channel
        self.memory: dict[str, int | str] = {}  # GET /memory: what this process holds, by part
        self.engine: Engine | None = None
        self._send_lock = threading.Lock()
        self._live: dict[int, Sequence] = {}  # request id -> its sequence, until its last event
        self._stopping = False
        self._traced: set[int] = set()  # request ids the HTTP process asked to stamp (TRACE), until admitted
        self._first_sent: dict[int, float] = {}  # a traced request's first token: when its EVENTS message left
        self._prev_iteration = (0.0, 0.0, 0)  # the last iteration's start, end and admitted count (traced only)
        # The MPS imitation's rule on what a client sees as free (mps_sim.py); the HTTP process is the client.
        self._mps = MpsClientSim.from_env(os.environ) if args.device == "cpu" else None

    def send(self, message: tuple[Any, ...]) -> None:
        data = p.frame(message)
        with self._send_lock:  # the engine thread's deliveries and this thread's replies
            self.channel.sendall(data)

    # ---- load ------------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """Load weights, build the engine, capture graphs; what the HTTP process needs to know of it."""
        import torch

        from .build import load_weights, read_config
        from .configs import shape_for
        from .engine import Engine
        from .model import GPT2
        from .tokenizer import load_tokenizer

        args = self.args
        device = args.device
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device")
        if args.threads:
            torch.set_num_threads(args.threads)
        config = read_config(args.artifact)
        tokenizer = load_tokenizer(args.artifact)
        dtype = getattr(torch, args.dtype or ("float16" if device == "cuda" else "float32"))
        shape = shape_for(config["fleetcast_reference"]["size"])
        weights = load_weights(args.artifact, device=device)
        model = GPT2(shape, weights, device=device, dtype=dtype)
        del weights
        max_batch = args.max_batch_size or (64 if device == "cuda" else 8)
        max_seq = args.max_seq_len or shape.n_positions
        slots = self._kv_slots(torch, shape, max_seq, dtype, device)
        self._lora_cache = self._allocate_lora_cache(torch, device, config)
        engine = Engine(
            model,
            max_batch_size=max_batch,
            max_seq_len=max_seq,
            vocab_size=tokenizer.vocab_size,
            eos_id=tokenizer.eos_id,
            cache_slots=slots,
            prefix_blocks=0 if args.no_block_reuse else args.prefix_cache_blocks,
            deliver=self._deliver_traced if TRACE else self._deliver,
        )
        if TRACE:
            self._trace_iterations(engine)
            engine.observer = IterationWatch(TRACE)
        self.memory["kv_cache_bytes"] = engine.cache.nbytes
        self.memory["prefix_cache_bytes"] = engine.prefix.nbytes if engine.prefix is not None else 0
        self.memory["kv_cache_slots"] = engine.cache.max_batch
        if device == "cpu" and args.sim_gpu_memory_bytes is not None:
            self._ledger_write(self._own_device_bytes() + engine.cache.nbytes + int(self.memory.get("lora_cache_bytes", 0)))
        engine.start()
        if device == "cuda":
            torch.cuda.synchronize()
            self.memory["torch_allocated_bytes"] = torch.cuda.memory_allocated()
            self.memory["torch_reserved_bytes"] = torch.cuda.memory_reserved()
        self.engine = engine
        threading.Thread(target=self._watch_engine, name="engine-watch", daemon=True).start()
        # PyTorch, the model and the captured graphs live as long as this process: out of every later full
        # collection, which would otherwise stop the engine's step loop for as long as it walks them, and full
        # collections only while no request is live here (runtime/heap.py).
        frozen = serve_gc_policy(lambda: bool(self._live)).frozen
        return {"max_batch_size": engine.max_batch_size, "max_seq_len": max_seq, "vocab_size": shape.vocab_size,
                "cuda_graphs": engine.cuda_graphs, "memory": dict(self.memory), "pid": os.getpid(),
                "heap_frozen": frozen}

    def _allocate_lora_cache(self, torch: Any, device: str, config: dict[str, Any]) -> Any:
        """The LoRA device cache TensorRT-LLM's PyTorch backend allocates for --lora-config's max_loras (none without
        it): the same bytes, from the artifact's config.json, as fleetcast.contract.adapters.lora_device_cache_bytes
        computes for the instance's memory plan, allocated after the KV cache as the engine does, so a GPU run
        measures what the plan counts."""
        from fleetcast.contract.adapters import lora_device_cache_bytes, model_dims

        lora = self.args.lora_config
        if lora is None or lora.get("max_loras") is None:
            return None
        dims = model_dims(config, f"{self.args.artifact}/config.json")
        size = lora_device_cache_bytes(dims, lora["lora_target_modules"], lora["max_lora_rank"], lora["max_loras"])
        self.memory.update(lora_cache_bytes=size, lora_max_loras=lora["max_loras"])
        return torch.empty(size, dtype=torch.uint8, device=device)

    def _kv_slots(self, torch: Any, shape: Any, max_seq: int, dtype: Any, device: str) -> int | None:
        """Cache slots from the KV budget, by TensorRT-LLM's rule (runtime/kv_budget.py): the smaller of
        --kv-cache-bytes (max_tokens) and --kv-cache-free-gpu-memory-fraction x the GPU memory free once the weights
        are loaded (so it depends on what else runs on the GPU); neither: max batch size slots, as before."""
        from .model import KVCache

        element = torch.empty((), dtype=dtype).element_size()
        slot = KVCache.slot_bytes(shape, max_seq, element)
        self.memory.update(kv_slot_bytes=slot, weights_bytes=shape.param_count() * element)
        free = self._free_bytes(torch, device)
        if free is not None:
            self.memory["free_before_kv_bytes"] = free
        candidates: list[tuple[int, str]] = []
        if self.args.kv_cache_bytes is not None:
            candidates.append((self.args.kv_cache_bytes, "--kv-cache-bytes"))
        if self.args.kv_cache_free_gpu_memory_fraction is not None and free is not None:
            candidates.append((int(self.args.kv_cache_free_gpu_memory_fraction * free),
                               "--kv-cache-free-gpu-memory-fraction"))
        if not candidates:
            return None
        budget, flag = min(candidates)
        self.memory.update(kv_budget_bytes=budget, kv_budget_source=flag)
        if budget < slot:
            raise ValueError(f"{flag}: a budget of {budget} bytes holds no sequence of {max_seq} tokens "
                             f"({slot} bytes each for this model)")
        return int(budget // slot)

    def _own_device_bytes(self) -> int:
        """What this process holds on its (simulated) GPU before its KV cache: weights and the per-process overhead
        the memory plan counts (fleetcast.contract.serving, measured with this backend)."""
        from fleetcast.contract.serving import PROCESS_OVERHEAD_BYTES

        return int(self.memory.get("weights_bytes", 0)) + PROCESS_OVERHEAD_BYTES

    def _free_bytes(self, torch: Any, device: str) -> int | None:
        """GPU memory free now: cuda's own figure; on cpu the simulated GPU's, less every process on its ledger."""
        if device == "cuda":
            # The weights load through transient buffers (fp32 before the cast) that torch's caching allocator
            # keeps reserved; they are this process's spare memory, not memory another process holds, so give them
            # back first (under an MPS memory limit they would otherwise come out of the KV budget).
            torch.cuda.empty_cache()
            return int(torch.cuda.mem_get_info()[0])
        capacity = self.args.sim_gpu_memory_bytes
        if capacity is None:
            return None
        own = self._own_device_bytes()
        self._ledger_write(own)
        free = int(capacity) - own - sum(held for pid, held in self._ledger() if pid != os.getpid())
        limit = pinned_limit(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
        if limit is not None and self._mps is not None:
            free = min(free, limit - own)
        return max(0, free)

    def _ledger(self) -> list[tuple[int, int]]:
        ledger = self.args.sim_gpu_ledger
        if ledger is None:
            return []
        out = []
        for entry in Path(ledger).glob("*"):
            try:
                pid, held = int(entry.name), int(entry.read_text())
                os.kill(pid, 0)
            except (ValueError, OSError):
                continue  # not an entry, or its process is gone (its memory with it)
            out.append((pid, held))
        return out

    def _ledger_write(self, held: int) -> None:
        """This process's entry (the engine process holds the simulated GPU's memory, so its pid names it)."""
        ledger = self.args.sim_gpu_ledger
        if ledger is None:
            return
        Path(ledger).mkdir(parents=True, exist_ok=True)
        tmp = Path(ledger) / f".{os.getpid()}"
        tmp.write_text(str(held))
        tmp.replace(Path(ledger) / str(os.getpid()))

    def memory_now(self) -> dict[str, Any]:
        """/memory's engine part: what load() allocated, and on cuda the peaks so far (what a process under an MPS
        memory limit must fit: activations, graphs, workspaces)."""
        report: dict[str, Any] = dict(self.memory)
        if self.args.device == "cuda":
            import torch

            free, total = torch.cuda.mem_get_info()
            report.update(torch_peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                          torch_peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                          torch_reserved_now_bytes=torch.cuda.memory_reserved(),
                          cuda_free_bytes=int(free), cuda_total_bytes=int(total))
        return report

    # ---- serving ---------------------------------------------------------------------------

    def _deliver(self, events: Events, at: float | None = None) -> None:
        """The engine's delivery (its thread): a delivery point's tokens for every sequence, in one message stamped
        `at` (default: now)."""
        out = []
        live = self._live
        for seq, token, reason in events:
            out.append((seq.sink, token, reason, seq.cached_tokens))
            if reason is not None:
                live.pop(seq.sink, None)
        try:
            self.send((p.EVENTS, time.monotonic() if at is None else at, out))
        except OSError:  # the HTTP process is gone; the channel's reader ends this process
            pass

    # ---- the TTFT trace (a test switch, runtime/ttft_trace.py) ------------------------------------------

    def _deliver_traced(self, events: Events) -> None:
        """_deliver, and when a traced request's first token left."""
        at = time.monotonic()
        self._deliver(events, at)
        for seq, token, _ in events:
            if seq.sink in self._traced and token is not None and seq.sink not in self._first_sent:
                self._first_sent[seq.sink] = at

    def _trace_iterations(self, engine: Engine) -> None:
        """Stamp each traced request's iteration: the engine's own per-iteration record (`_record`, called at the
        end of every iteration with its start and the requests it admitted) is wrapped on this instance, which
        leaves the engine's admission and prefill code as it is. A traced request's line says when this process
        received it (`Sequence.submitted`), when the iteration that admitted it started (its queue's end, as the
        engine's own queue latency counts it), when its first token left, when that iteration ended, and the
        iteration before it (a request that came during it waited for its end)."""
        record = engine._record

        def traced(started: float, admitted: list[Sequence], *rest: Any) -> None:
            ended = time.monotonic()
            record(started, admitted, *rest)
            traced_ids, prev = self._traced, self._prev_iteration
            for seq in admitted:
                if seq.sink in traced_ids and TRACE:
                    traced_ids.discard(seq.sink)
                    TRACE.write({"kind": "engine", "rid": seq.sink, "received": seq.submitted, "admitted": seq.admitted,
                                 "iter_start": started,
                                 "first_sent": self._first_sent.pop(seq.sink, None), "iter_end": ended,
                                 "iter_admitted": len(admitted), "prev_iter_start": prev[0], "prev_iter_end": prev[1],
                                 "prev_iter_admitted": prev[2]})
            self._prev_iteration = (started, ended, len(admitted))

        engine._record = traced  # type: ignore[method-assign,assignment]

    def _watch_engine(self) -> None:
        """The engine thread's end: a failure is told to the HTTP process (its pending requests' error events went
        first), which exits 1 so the supervisor restarts the server."""
        engine = self.engine
        assert engine is not None and engine._thread is not None
        engine._thread.join()
        if engine.failed is not None and not self._stopping:
            try:
                self.send((p.FAILED, repr(engine.failed)))
            except OSError:
                pass

    def _submit(self, rid: int, prompt: list[int], params: p.SamplingParams, salt: str | None) -> None:
        from .engine import Sequence

        assert self.engine is not None
        seq = Sequence(prompt=prompt, params=params, salt=salt, sink=rid)
        self._live[rid] = seq
        try:
            self.engine.submit(seq)
        except (ValueError, RuntimeError):  # checked by the HTTP process already; or the engine stopped meanwhile
            self._live.pop(rid, None)
            self.send((p.EVENTS, time.monotonic(), [(rid, None, "error", 0)]))

    def serve(self, frames: p.Frames, early: list[tuple[Any, ...]] | None = None) -> int:
        """Read the channel until STOP (0) or its end (the parent is gone: 1); `early`: messages already read."""
        assert self.engine is not None
        engine = self.engine
        messages = early or []
        while True:
            for message in messages:
                kind = message[0]
                if kind == p.SUBMIT:
                    self._submit(*message[1:])
                elif kind == p.TRACE:
                    self._traced.add(message[1])
                elif kind == p.CANCEL:
                    seq = self._live.get(message[1])
                    if seq is not None:
                        engine.cancel(seq)
                elif kind == p.STATS:
                    self.send((p.REPLY, message[1], engine.pop_stats()))
                elif kind == p.MEMORY:
                    self.send((p.REPLY, message[1], self.memory_now()))
                elif kind == p.STOP:
                    # Stopping the engine retires what is left with finish_reason "cancelled" (their events go
                    # first), so a stream the drain bound cut short ends with its usage chunk, not a dropped socket.
                    self._stopping = True
                    engine.stop()
                    self.send((p.STOPPED,))
                    return 0
            try:
                data = self.channel.recv(1 << 16)
            except ConnectionResetError:  # it closed its end with events of ours unread: gone all the same
                data = b""
            if not data:
                log.error("the HTTP process is gone; the engine process ends")
                return 1
            messages = frames.feed(data)


def main() -> int:
    global TRACE
    TRACE = tracer("engine")
    die_with_parent()
    # The drain is the HTTP process's: it stops this one with STOP once its requests are done (a SIGTERM to the
    # whole group, as the supervisor sends, must not end the engine under the requests still draining).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = socket.socket(fileno=os.dup(0))
    channel.setblocking(True)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the channel lives on as `channel` only; its end of file is the parent's end closing
    os.close(devnull)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    frames = p.Frames()
    start: tuple[Any, ...] | None = None
    pending: list[tuple[Any, ...]] = []
    while start is None:
        data = channel.recv(1 << 16)
        if not data:
            return 1
        pending = frames.feed(data)
        if pending:
            start, pending = pending[0], pending[1:]
    if start[0] != p.START:
        log.error("the engine process expected START first, got %r", start[0])
        return 2
    host = EngineHost(start[1], channel)
    try:
        info = host.load()
    except Exception as exc:  # any load failure is told to the HTTP process, which exits 1
        log.exception("engine load failed")
        host.send((p.LOAD_FAILED, str(exc) or repr(exc)))
        return 1
    host.send((p.READY, info))
    if TRACE:
        TRACE.watch_gc()
    return host.serve(frames, pending)


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    # No interpreter shutdown: the engine thread (a daemon) may still hold the model, and its pending events are sent.
    os._exit(code)
