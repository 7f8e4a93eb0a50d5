"""OpenAI-compatible HTTP server for the reference backend (the trtllm-serve surface).

Endpoints, matching trtllm-serve where the runtime and the benchmarks depend on them:
  POST /v1/completions       prompt as text or token ids; SSE with "stream": true; usage chunk when
                             stream_options.include_usage; max_tokens, min_tokens, ignore_eos,
                             temperature (0 = greedy), top_p, top_k, seed; cache_salt (prefix-cache
                             blocks are reused only between requests of one salt: prefix_cache.py)
  POST /v1/chat/completions  400: GPT-2 has no chat template (as with trtllm-serve, use /v1/completions)
  GET  /v1/models, /version
  GET  /health               200 when serving; 503 while loading, draining or after an engine failure
  GET  /metrics              JSON list of iteration stats since the last read (dequeued on read)

Two processes, as trtllm-serve's OpenAI server and its executor workers: this one (HTTP: parsing, the SSE encoding
and the socket writes of every stream) and the engine process it starts (worker.py: the model, the KV cache and the
engine's step loop), which gets requests and cancellations and sends back each delivery point's tokens for every
sequence in one message (proxy.py, protocol.py). Apart, a stream's per-token Python no longer runs under the
engine's interpreter lock, inside its step. Only the engine process imports PyTorch.

SIGTERM/SIGINT drain: /health turns 503 at once, new generation requests get 503, requests in
flight run to their full token counts (bounded by --drain-timeout, after which they are cut),
then the engine process is stopped and the server exits 0. A dead engine process makes the server exit 1.

LoRA (`--lora-config JSON`: the `lora_config` TensorRT-LLM's LLM API gets, fleetcast.contract.adapters):
a completion may carry `lora_request` {lora_name, lora_int_id, lora_path}, as trtllm-serve's
CompletionRequest does (tensorrt_llm/serve/openai_protocol.py). The adapter at lora_path is checked as
the engine would load it (adapter_config.json + adapter_model weights; its rank within max_lora_rank, its
modules among lora_target_modules); what cannot be loaded is a 400 BadRequestError, the shape of
trtllm-serve's create_error_response (tensorrt_llm/serve/openai_server.py). The random-weight reference
model does not apply the adapter's weights: it serves the request as the base model and logs its lora_name.
With `max_loras` in the options it allocates the LoRA device cache TensorRT-LLM would (its bytes in GET /memory)
and runs requests of at most that many adapters at once, the others waiting for a slot (AdapterSlots).

Usage: python -m runtime.reference.server --artifact DIR [--host 127.0.0.1] [--port 8000]
       [--max-batch-size N] [--max-seq-len N] [--device cpu|cuda] [--drain-timeout S]
       [--served-model-name NAME] [--request-log FILE.jsonl]
       [--kv-cache-bytes N] [--kv-cache-free-gpu-memory-fraction F] [--lora-config JSON]
       [--prefix-cache-blocks N | --no-block-reuse]
       [--sim-gpu-memory-bytes N [--sim-gpu-ledger DIR]] [--fault-on-signal]

KV budget: the smaller of --kv-cache-bytes and the fraction of the GPU memory free once the weights are loaded,
TensorRT-LLM's min(kv_cache_config.max_tokens, free_gpu_memory_fraction x free memory) (runtime/kv_budget.py). Free
memory counts every other process on the GPU; on cpu, --sim-gpu-memory-bytes stands for the GPU's memory, and the
processes that share one --sim-gpu-ledger directory count each other's weights, overhead and KV cache, so a
loopback test sees the rule bite when several processes share one "GPU". A process run as an MPS client with
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT sees at most that limit, less what it holds, as free.

--fault-on-signal (tests only, off by default; a signal, so nothing reaches it through the gateway): SIGUSR2 makes
the process fail as a CUDA illegal memory access does, and under an MPS control daemon on cpu the fault is reported
to every client of that daemon, which then stops answering (runtime/reference/mps_sim.py).
  GET  /memory (reference only)  the KV budget, the cache it allocated, the LoRA device cache (lora_cache_bytes,
                                 where --lora-config has max_loras), weights and torch memory
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
import time
import uuid
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..heap import serve_gc_policy
from ..ttft_trace import HEADER as TRACE_HEADER, Trace, tracer
from .mps_sim import MpsClientSim
from .protocol import SamplingParams
from .proxy import EngineLoadFailed, EngineProxy, RemoteSequence

if TYPE_CHECKING:
    from .tokenizer import ByteTokenizer

log = logging.getLogger("fleetcast.reference.server")
# What the engine proxy's dispatch queues for a request: (token or None, finish reason or None, monotonic time of its delivery).
Event = tuple[int | None, str | None, float]

VERSION = "fleetcast-reference-0.1"
# None unless the test switch is on (runtime/ttft_trace.py); read in main, not at import (a fork's environment is
# its own: tests/runtime/test_zygote.py).
TRACE: Trace | None = None


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    body = {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    return web.json_response(body, status=status)


# Iteration stats encoded per slice, the event loop's turn between two: a read of /metrics carries every iteration
# since the last (hundreds a second on a GPU), and json.dumps of 600 of them holds this process's loop, every stream's
# tokens with it, for 27 ms on the dev VM: the H100 run's HTTP process was late 15-23 ms at intervals of ~0.53 s,
# the fairness bench's poll period (bench/FAIRNESS_DEVICE.md, call 4).
METRICS_SLICE = 50


async def json_in_slices(items: list[Any], size: int = METRICS_SLICE) -> bytes:
    """`json.dumps(items)` as bytes, encoded `size` items at a time with the loop's turn between two slices."""
    parts = []
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(0)
        parts.append(json.dumps(items[start:start + size])[1:-1])
    return ("[" + ", ".join(p for p in parts if p) + "]").encode()


class TextChunks:
    """One stream's SSE text events: `data: ` and the JSON of the chunk (id, object, created, model, one choice with
    its text and finish reason; `usage: null` where the stream ends with a usage event), the bytes json.dumps gives
    for it. Only the text and the finish reason change from token to token, and `created` once a second, so the
    rest is encoded once a second instead of once a token (the stream's handler runs once per token and step)."""

    _TEXT, _FINISH = "\x00text", "\x00finish"  # stand-ins no text or finish reason is

    def __init__(self, rid: str, model: str, include_usage: bool) -> None:
        self.rid, self.model, self.include_usage = rid, model, include_usage
        self._created = -1
        self._parts: tuple[bytes, bytes, bytes] = (b"", b"", b"")

    def chunk(self, created: int, text: str, finish: str | None) -> dict[str, Any]:
        """The chunk as an object (what the bytes encode)."""
        out: dict[str, Any] = {"id": self.rid, "object": "text_completion", "created": created, "model": self.model,
                               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                            "stop_reason": None}]}
        if self.include_usage:
            out["usage"] = None
        return out

    def __call__(self, text: str, finish: str | None) -> bytes:
        created = int(time.time())
        if created != self._created:
            whole = b"data: " + json.dumps(self.chunk(created, self._TEXT, self._FINISH)).encode() + b"\n\n"
            head, rest = whole.split(json.dumps(self._TEXT).encode())
            middle, tail = rest.split(json.dumps(self._FINISH).encode())
            self._created, self._parts = created, (head, middle, tail)
        head, middle, tail = self._parts
        # encode_basestring_ascii is what json.dumps runs on a str with its defaults (ensure_ascii), without the
        # encoder's set-up around it.
        finished = b"null" if finish is None else _json_str(finish).encode()
        return b"".join((head, _json_str(text).encode(), middle, finished, tail))


class Collected:
    """A request answered in one body: its events kept as they come and handed over once, at its finish, so its
    handler wakes once per request instead of once per token and step (the engine proxy puts into it as into a queue)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def put_nowait(self, event: Event) -> None:
        self.events.append(event)
        if event[1] is not None and not self.finished.done():
            self.finished.set_result(None)


class RequestError(ValueError):
    """A request field is invalid; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _int_field(body: dict[str, Any], name: str, default: int, lo: int, hi: int | None = None) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(name, f"must be an integer {bound}, got {value!r}")
    return value


def _float_field(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise RequestError(name, f"must be a number between {lo} and {hi}, got {value!r}")
    return float(value)


def parse_completion_request(body: object, tokenizer: ByteTokenizer) -> tuple[list[int], dict[str, Any]]:
    """Validate a /v1/completions body; return (prompt token ids, options). Raises RequestError."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("prompt", "the reference backend serves one prompt per request; send them separately")
    else:
        raise RequestError("prompt", "must be a non-empty string or a non-empty list of token ids")
    if not ids:
        raise RequestError("prompt", "must not be empty")
    if _int_field(body, "n", 1, 1) != 1:
        raise RequestError("n", "only n=1 is supported by the reference backend")
    for unsupported in ("logprobs", "suffix"):
        if body.get(unsupported) not in (None, 0, False):
            raise RequestError(unsupported, "is not supported by the reference backend")
    if body.get("echo"):
        raise RequestError("echo", "is not supported by the reference backend")
    if body.get("stop") not in (None, [], ""):
        raise RequestError("stop", "stop strings are not supported by the reference backend")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream", f"must be true or false, got {stream!r}")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise RequestError("stream_options", "must be an object")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("ignore_eos", f"must be true or false, got {ignore_eos!r}")
    max_tokens = _int_field(body, "max_tokens", 16, 1)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("seed", f"must be an integer, got {seed!r}")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt.strip()):
        # TensorRT-LLM's check_cache_salt_support (tensorrt_llm/serve/openai_protocol.py) refuses the same.
        raise RequestError("cache_salt", "must be a non-empty string if provided")
    options = {
        "stream": stream,
        "include_usage": bool(stream_options.get("include_usage", False)),
        "max_tokens": max_tokens,
        "min_tokens": _int_field(body, "min_tokens", 0, 0, max_tokens),
        "ignore_eos": ignore_eos,
        "temperature": _float_field(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _float_field(body, "top_p", 1.0, 0.0, 1.0) or 1.0,
        "top_k": _int_field(body, "top_k", 0, 0),
        "seed": seed,
        "cache_salt": salt,
    }
    return ids, options


def check_lora_request(value: object, lora: dict[str, Any] | None) -> str:
    """The adapter name of a request's `lora_request`, once its adapter is one this engine could load."""
    from fleetcast.contract.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterConfigError, adapter_shape

    if lora is None:
        raise RequestError("lora_request", "this server was started without lora_config; it serves no adapters")
    if not isinstance(value, dict) or set(value) - {"lora_name", "lora_int_id", "lora_path", "lora_ckpt_source"}:
        raise RequestError("lora_request", "must be an object with lora_name, lora_int_id and lora_path")
    name, number, path = value.get("lora_name"), value.get("lora_int_id"), value.get("lora_path")
    if not isinstance(name, str) or not name:
        raise RequestError("lora_request", "lora_name must be a non-empty string")
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise RequestError("lora_request", f"lora_int_id must be a positive integer, got {number!r}")
    if not isinstance(path, str) or not Path(path).is_dir():
        raise RequestError("lora_request", f"lora_path {path!r} does not exist")
    directory = Path(path)
    if not (directory / ADAPTER_CONFIG).is_file() or not any((directory / w).is_file() for w in ADAPTER_WEIGHTS):
        raise RequestError("lora_request", f"lora_path {path} holds no {ADAPTER_CONFIG} and adapter_model weights")
    try:
        rank, modules = adapter_shape((directory / ADAPTER_CONFIG).read_bytes(), f"lora_path {path}")
    except AdapterConfigError as exc:
        raise RequestError("lora_request", str(exc)) from None
    if rank > lora["max_lora_rank"]:
        raise RequestError("lora_request", f"adapter {name} has rank {rank}, above max_lora_rank "
                                           f"{lora['max_lora_rank']}")
    outside = sorted(set(modules) - set(lora["lora_target_modules"]))
    if outside:
        raise RequestError("lora_request", f"adapter {name} adapts {', '.join(outside)}, not among "
                                           f"lora_target_modules {', '.join(lora['lora_target_modules'])}")
    return name


class AdapterSlots:
    """The adapters the LoRA device cache holds: requests of at most `max_loras` different adapters run at once;
    one for another adapter waits until an adapter has no request left, and requests of an adapter already held
    join at once. TensorRT-LLM's capacity scheduler does the like: it schedules a request only when the PEFT cache
    manager can hold its task's pages (cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp), which max_loras
    sizes for that many max-sized adapters. A stand-in: the engine counts pages, not adapters."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.active: dict[str, int] = {}  # adapter -> its requests running
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self, name: str) -> None:
        while name not in self.active and len(self.active) >= self.max_loras:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        self.active[name] = self.active.get(name, 0) + 1

    def release(self, name: str) -> None:
        self.active[name] -= 1
        if self.active[name] == 0:
            del self.active[name]
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


class ReferenceServer:
    """Loads the artifact, runs the engine and serves HTTP; owns readiness and drain state."""

    def __init__(self, args: argparse.Namespace) -> None:
        from .build import read_config
        from .tokenizer import load_tokenizer

        self.args = args
        self.config = read_config(args.artifact)
        self.tokenizer = load_tokenizer(args.artifact)
        meta = self.config["fleetcast_reference"]
        self.model_name = args.served_model_name or f"fleetcast-reference/{meta['size']}"
        self.state = "loading"  # loading -> ready -> draining; or failed
        self.engine: EngineProxy | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._mps_task: asyncio.Task[None] | None = None
        self.inflight = 0
        self.created = int(time.time())
        self.stopped = asyncio.Event()
        self.exit_code = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._request_log = (open(args.request_log, "a", encoding="utf-8")  # noqa: SIM115 - closed by stop()
                             if args.request_log else None)
        # GET /memory: this process, and what the engine process holds, by part (its figures, after it loaded)
        self.memory: dict[str, int | str] = {"pid": os.getpid()}
        # On cpu, the imitation of an MPS server's fault containment, where a control daemon runs (mps_sim.py).
        self.mps = MpsClientSim.from_env(os.environ) if args.device == "cpu" else None
        max_loras = (args.lora_config or {}).get("max_loras")
        self.adapter_slots = AdapterSlots(max_loras) if max_loras is not None else None

    # ---- lifecycle ---------------------------------------------------------------------

    async def start_engine(self) -> None:
        """Start the engine process (worker.py) and wait until it has loaded the artifact: the model, the KV cache
        and the engine's step loop run there, this process keeps HTTP and everything per stream."""
        started = time.monotonic()
        if self.mps is not None:
            self.mps.connect()  # refused while the clients of a fault still run; this process is the client
        engine = EngineProxy(self.args)
        self.engine = engine  # before it loads: a drain or a stop ends its process too
        try:
            await engine.start()
        except EngineLoadFailed:
            self.engine = None
            await engine.stop()
            raise
        self.memory.update(engine.info["memory"], engine_pid=engine.info["pid"])
        # This process's startup heap (aiohttp, the app) out of every later full collection, as the engine process
        # froze its own, and full collections only while no stream is open (runtime/heap.py): a collection here
        # holds back every stream's tokens and every submission.
        frozen = serve_gc_policy(engine.holds_streams).frozen
        log.info("model %s loaded on %s in %.2fs (max batch %d, graphs %s; engine process %d; startup heap frozen: "
                 "%d objects in the engine process, %d here)", self.model_name, self.args.device,
                 time.monotonic() - started, engine.info["max_batch_size"], engine.info["cuda_graphs"],
                 engine.info["pid"], engine.info["heap_frozen"], frozen)

    async def serve(self) -> int:
        app = self.make_app()
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, self.args.host, self.args.port)
        await site.start()
        log.info("listening on http://%s:%d", self.args.host, self.args.port)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.begin_drain)
        if self.args.fault_on_signal:
            loop.add_signal_handler(signal.SIGUSR2, self.fault)
        if self.mps is not None:
            self._mps_task = loop.create_task(self._watch_mps())
        if TRACE:
            TRACE.watch_loop()
            TRACE.watch_gc()
        try:
            await self.start_engine()
            if self.state == "loading":
                self.state = "ready"
                print(f"READY http://{self.args.host}:{self.args.port}", flush=True)
            # Held: the loop keeps only a weak reference to a task.
            self._watch_task = loop.create_task(self._watch_engine())
        except Exception as exc:  # noqa: BLE001 - any load failure ends in the failed state and exit 1
            log.error("failed to load %s: %s", self.args.artifact, exc)
            self.state = "failed"
            self.exit_code = 1
            self.stopped.set()
        await self.stopped.wait()
        if self.engine is not None:
            # Stopping the engine first ends any stream the drain bound cut short with
            # finish_reason "cancelled" (and its usage chunk), instead of a dropped connection.
            await self.engine.stop()
        await runner.cleanup()
        if self._request_log:
            self._request_log.close()
        return self.exit_code

    def fault(self) -> None:
        """--fault-on-signal: fail as a CUDA illegal memory access does (the process dies); under an MPS daemon the
        fault reaches every client of the GPU first."""
        log.error("CUDA error: an illegal memory access was encountered (fault requested by SIGUSR2)")
        if self.mps is not None:
            self.mps.fault()
        logging.shutdown()
        os._exit(1)

    async def _watch_mps(self) -> None:
        """A fault of another client of the MPS server reaches this one: from then on it does not answer, while it
        stays alive (time.sleep in the event loop's thread holds every handler), as the H200's co-located server did."""
        assert self.mps is not None
        while not self.stopped.is_set():
            if self.mps.reported():
                log.error("a fatal GPU exception was reported by the MPS server (another client faulted); "
                          "this process no longer makes progress")
                time.sleep(365 * 86400)
            await asyncio.sleep(0.1)

    async def _watch_engine(self) -> None:
        """Exit 1 soon after the engine thread dies, so the supervisor restarts the server
        rather than leaving a process that answers 503 forever."""
        while not self.stopped.is_set():
            if self.engine is not None and self.engine.failed is not None:
                log.error("engine failed (%r); exiting", self.engine.failed)
                self.state = "failed"
                self.exit_code = 1
                await asyncio.sleep(0.5)  # let handlers flush their error chunks
                self.stopped.set()
                return
            await asyncio.sleep(0.2)

    def begin_drain(self) -> None:
        if self.state == "draining":
            return
        was_loading = self.state != "ready"
        self.state = "draining"
        log.info("drain: health is 503, %d request(s) in flight", self.inflight)
        if was_loading:
            self.stopped.set()
            return
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=self.args.drain_timeout)
            log.info("drain: all in-flight requests finished")
        except TimeoutError:
            log.warning("drain: %d request(s) still running after %.1fs; stopping", self.inflight, self.args.drain_timeout)
            self.exit_code = 0
        self.stopped.set()

    # ---- HTTP ----------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/memory", self.memory_report)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    def _serving_error(self) -> web.Response | None:
        if self.engine is not None and self.engine.failed is not None:
            return _error(503, "the engine failed; this server is not serving")
        if self.state != "ready":
            return _error(503, f"server is {self.state}")
        return None

    async def health(self, request: web.Request) -> web.Response:
        if self._serving_error() is not None:
            return web.Response(status=503, text=self.state)
        return web.Response(status=200)

    async def memory_report(self, request: web.Request) -> web.Response:
        """Reference-only: the KV budget and what was allocated for it (the co-location measurements), and on cuda
        the peaks so far (what a process under an MPS memory limit must fit: activations, graphs, workspaces); the
        engine process's figures, asked of it now."""
        report = dict(self.memory)
        if self.engine is not None and self.engine.info:
            report.update(await self.engine.memory())
        return web.json_response(report)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION, "backend": "reference"})

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "fleetcast"}
        return web.json_response({"object": "list", "data": [model]})

    async def metrics(self, request: web.Request) -> web.Response:
        loaded = self.engine is not None and self.engine.info
        stats = await self.engine.pop_stats() if loaded and self.engine is not None else []
        return web.Response(body=await json_in_slices(stats), content_type="application/json")

    async def chat(self, request: web.Request) -> web.Response:
        return _error(400, "chat completions need a chat template and this GPT-2 model has none; use /v1/completions",
                      "messages")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        stamps = {"kind": "http", "id": request.headers[TRACE_HEADER], "received": time.monotonic()} \
            if TRACE and TRACE_HEADER in request.headers else None
        refused = self._serving_error()
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body: not valid JSON", "body")
        try:
            prompt, opts = parse_completion_request(body, self.tokenizer)
            lora_name = check_lora_request(body["lora_request"], self.args.lora_config) \
                if body.get("lora_request") is not None else None
        except RequestError as exc:
            return _error(400, str(exc), exc.param)

        # Filled by the proxy's dispatch: a stream's handler takes each step's token as it comes; a collected request's only
        # wakes at the end.
        events: asyncio.Queue[Event] = asyncio.Queue()
        collected = Collected()
        params = SamplingParams(
            max_tokens=opts["max_tokens"], min_tokens=opts["min_tokens"], ignore_eos=opts["ignore_eos"],
            temperature=opts["temperature"], top_p=opts["top_p"], top_k=opts["top_k"], seed=opts["seed"],
        )
        assert self.engine is not None  # _serving_error() let only `ready` through, set after the engine
        slots = self.adapter_slots if lora_name is not None else None
        if slots is not None and lora_name is not None:
            self.inflight += 1  # waiting for a slot of the LoRA device cache is in flight: a drain waits for it
            self._idle.clear()
            try:
                await slots.acquire(lora_name)
            except BaseException:
                self.inflight -= 1
                if self.inflight == 0:
                    self._idle.set()
                raise
            self.inflight -= 1  # counted again once submitted, with no await in between
        if stamps is not None:
            stamps["submitted"] = time.monotonic()  # before the SUBMIT leaves: the engine's receipt comes after
        try:
            seq = self.engine.submit(prompt, params, opts["cache_salt"], events if opts["stream"] else collected,
                                     traced=stamps is not None)
        except (ValueError, RuntimeError) as exc:
            if slots is not None and lora_name is not None:
                slots.release(lora_name)
            if isinstance(exc, RuntimeError):
                return _error(503, str(exc))
            return _error(400, str(exc), str(exc).split(":", 1)[0])

        self.inflight += 1
        self._idle.clear()
        record = {"request_id": f"cmpl-{uuid.uuid4().hex}", "prompt_tokens": len(prompt), "completion_tokens": 0,
                  "status": 200, "finish_reason": None, "stream": opts["stream"]}
        if lora_name is not None:
            record["lora_name"] = lora_name
        arrived = time.monotonic()
        token_times: list[float] = []
        if stamps is not None:
            stamps["rid"] = seq.id
        try:
            if opts["stream"]:
                return await self._stream(request, seq, events, opts, record, token_times, stamps)
            return await self._collect(collected, record, token_times)
        except (asyncio.CancelledError, ConnectionResetError):
            self.engine.cancel(seq)
            record["status"] = 499
            raise
        finally:
            if slots is not None and lora_name is not None:
                slots.release(lora_name)
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()
            record["cached_tokens"] = seq.cached_tokens
            self._log_request(record, arrived, token_times)
            if stamps is not None and TRACE:
                TRACE.write(stamps)

    async def _stream(self, request: web.Request, seq: RemoteSequence, events: asyncio.Queue[Event], opts: dict[str, Any],
                      record: dict[str, Any], token_times: list[float],
                      stamps: dict[str, Any] | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        decoder = self.tokenizer.stream_decoder()
        rid = record["request_id"]
        chunk = TextChunks(rid, self.model_name, opts["include_usage"])
        try:
            done = False
            while not done:
                # Whatever arrived since this handler last ran goes out in one write: a stream that fell behind catches
                # up in one send, not one per token (each token still its own SSE event, as trtllm-serve sends them).
                batch = [await events.get()]
                if stamps is not None and "taken" not in stamps:
                    stamps["taken"], stamps["engine_sent"] = time.monotonic(), batch[0][2]
                while batch[-1][1] is None and not events.empty():
                    batch.append(events.get_nowait())
                out = []
                for token, reason, at in batch:
                    text = ""
                    if token is not None:
                        token_times.append(at)
                        record["completion_tokens"] += 1
                        text = decoder.push(token)
                    if reason is not None:
                        text += decoder.flush()
                        record["finish_reason"] = reason
                        done = True
                    if token is not None or reason in ("cancelled", "error"):
                        if reason == "error":
                            record["status"] = 500
                            err = {"object": "error", "message": "the engine failed mid-generation", "code": 500}
                            out.append(b"data: " + json.dumps({"error": err}).encode() + b"\n\n")
                        else:
                            out.append(chunk(text, reason))
                if out:
                    if stamps is not None and "writing" not in stamps:
                        stamps["writing"] = time.monotonic()  # before the write: the gateway may read it at once
                    await resp.write(b"".join(out))
            if opts["include_usage"]:
                usage = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.model_name,
                         "choices": [], "usage": self._usage(record)}
                await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            # The client left mid-stream (aiohttp raises ClientConnectionResetError, a ConnectionResetError, on the
            # next write): the sequence stops, and the prepared response goes back to aiohttp, whose finish_response
            # treats the closed connection as a disconnect, where a raise would be logged as a handler error with
            # its traceback (one per stream a leaving client held).
            assert self.engine is not None  # a stream is only ever started by `completions`, past the same assert
            self.engine.cancel(seq)
            record["status"] = 499
        return resp

    async def _collect(self, collected: Collected, record: dict[str, Any], token_times: list[float]) -> web.Response:
        await collected.finished
        tokens: list[int] = []
        reason = None
        for token, reason, at in collected.events:
            if token is not None:
                tokens.append(token)
                token_times.append(at)
            if reason is not None:
                break
        record["completion_tokens"] = len(tokens)
        record["finish_reason"] = reason
        if reason == "error":
            record["status"] = 500
            return _error(500, "the engine failed mid-generation")
        body = {"id": record["request_id"], "object": "text_completion", "created": int(time.time()),
                "model": self.model_name,
                "choices": [{"index": 0, "text": self.tokenizer.decode(tokens), "logprobs": None,
                             "finish_reason": reason, "stop_reason": None}],
                "usage": self._usage(record)}
        return web.json_response(body)

    @staticmethod
    def _usage(record: dict[str, Any]) -> dict[str, Any]:
        return {"prompt_tokens": record["prompt_tokens"], "completion_tokens": record["completion_tokens"],
                "total_tokens": record["prompt_tokens"] + record["completion_tokens"]}

    def _log_request(self, record: dict[str, Any], arrived: float, token_times: list[float]) -> None:
        """One JSON line per request (server-side timings), for the runtime's per-request metrics."""
        if token_times:
            record["ttft_ms"] = round((token_times[0] - arrived) * 1000, 3)
            record["e2e_ms"] = round((token_times[-1] - arrived) * 1000, 3)
            if len(token_times) > 1:
                record["itl_ms"] = round((token_times[-1] - token_times[0]) * 1000 / (len(token_times) - 1), 3)
        record["ts"] = time.time()
        if self._request_log:
            self._request_log.write(json.dumps(record) + "\n")
            self._request_log.flush()


def _lora_config(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not JSON") from None
    if not isinstance(value, dict) or not isinstance(value.get("max_lora_rank"), int) \
            or not isinstance(value.get("lora_target_modules"), list):
        raise argparse.ArgumentTypeError("needs max_lora_rank (an integer) and lora_target_modules (a list)")
    max_loras = value.get("max_loras")
    if max_loras is not None and (not isinstance(max_loras, int) or isinstance(max_loras, bool) or max_loras < 1):
        raise argparse.ArgumentTypeError(f"max_loras must be a positive integer, got {max_loras!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m runtime.reference.server", description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", required=True, help="directory written by runtime.reference.build")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"),
                    help="compute dtype; default float16 on cuda, float32 on cpu")
    ap.add_argument("--max-batch-size", type=int, default=None, help="default 64 on cuda, 8 on cpu")
    ap.add_argument("--max-seq-len", type=int, default=None, help="prompt + output tokens; default n_positions")
    ap.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests get after SIGTERM")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--request-log", default=None, help="append one JSON line per request to this file")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--kv-cache-bytes", type=int, default=None,
                    help="KV cache budget in bytes (whole sequences of --max-seq-len; also caps the batch); with the "
                         "fraction, the smaller of the two")
    ap.add_argument("--kv-cache-free-gpu-memory-fraction", type=float, default=None,
                    help="KV cache budget as a fraction of the GPU memory free after the weights load (cuda, or cpu "
                         "with --sim-gpu-memory-bytes)")
    ap.add_argument("--sim-gpu-memory-bytes", type=int, default=None,
                    help="cpu: the memory of the GPU this process stands in for (its free memory, for the fraction)")
    ap.add_argument("--sim-gpu-ledger", default=None,
                    help="cpu: a directory where the processes sharing one simulated GPU record what they hold")
    ap.add_argument("--fault-on-signal", action="store_true",
                    help="tests only: SIGUSR2 makes the process fail as a CUDA illegal memory access does")
    ap.add_argument("--no-block-reuse", action="store_true",
                    help="no prefix cache: every prompt is prefilled in full (TensorRT-LLM's "
                         "kv_cache_config.enable_block_reuse false)")
    ap.add_argument("--prefix-cache-blocks", type=int, default=None,
                    help="KV blocks of 64 tokens the prefix cache keeps for reuse by later prompts with the same "
                         "cache_salt (default: two full sequences' worth)")
    ap.add_argument("--lora-config", default=None, type=_lora_config,
                    help="JSON: the LoRA options TensorRT-LLM gets as lora_config (max_lora_rank, lora_target_modules, "
                         "...); requests may then name an adapter in lora_request")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error(f"--port: must be between 1 and 65535, got {args.port}")
    if args.max_batch_size is not None and args.max_batch_size < 1:
        ap.error(f"--max-batch-size: must be >= 1, got {args.max_batch_size}")
    if args.drain_timeout < 0:
        ap.error(f"--drain-timeout: must be >= 0, got {args.drain_timeout}")
    if args.prefix_cache_blocks is not None and args.prefix_cache_blocks < 1:
        ap.error(f"--prefix-cache-blocks: must be >= 1, got {args.prefix_cache_blocks} (no reuse: --no-block-reuse)")
    if args.kv_cache_bytes is not None and args.kv_cache_bytes < 1:
        ap.error(f"--kv-cache-bytes: must be >= 1, got {args.kv_cache_bytes}")
    if args.sim_gpu_memory_bytes is not None and args.sim_gpu_memory_bytes < 1:
        ap.error(f"--sim-gpu-memory-bytes: must be >= 1, got {args.sim_gpu_memory_bytes}")
    fraction = args.kv_cache_free_gpu_memory_fraction
    if fraction is not None and not 0 < fraction < 1:
        ap.error(f"--kv-cache-free-gpu-memory-fraction: must be between 0 and 1 (exclusive), got {fraction}")
    return args


def main(argv: list[str] | None = None) -> int:
    global TRACE
    TRACE = tracer("http")
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Only the engine process imports PyTorch (worker.py); this one needs to know it is there.
    if importlib.util.find_spec("torch") is None:
        print("error: the reference server needs PyTorch: install the 'reference' extra "
              "(pip install -e '.[reference]')", file=sys.stderr)
        return 2
    if not Path(args.artifact).is_dir():
        print(f"error: --artifact: {args.artifact} is not a directory", file=sys.stderr)
        return 2
    try:
        server = ReferenceServer(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(server.serve())


if __name__ == "__main__":
    sys.exit(main())
