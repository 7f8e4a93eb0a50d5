"""A fake OpenAI-compatible streaming server with known timings, for proving
benchmark accuracy (a development tool, not a serving backend).

It streams `max_tokens` tokens per request with an injected time to first token
(TTFT) and inter-token gap (ITL), each with optional uniform jitter and rare
spikes, and logs when it actually wrote each token to the socket. That log is
the ground truth a benchmark client's figures are compared with
(`GET /_truth`, `POST /_truth/reset`). Truth TTFT runs from the kernel's receive time
of the request (SO_TIMESTAMPNS, so a server slow to wake does not shorten it)
to the moment the first content token is written (stamped just before the
write call); a client adds one loopback hop (tens of microseconds) on top.

Several models (`--serve-model ID[=TTFT_MS/ITL_MS]`, repeatable): GET /v1/models lists them, each
answers with its own timings, and any other `model` gets the gateway's 404 model_not_found (as
OpenAI words it); without them the server answers every `model` as fleetcast-testserver.

Tokens are whitespace-separated words: prompt_tokens is the prompt's word count,
and every streamed chunk carries exactly one token, so a client's token counts
and the server's agree. It speaks HTTP/1.1 with keep-alive and chunked SSE on
raw asyncio transports so that the server itself stays cheap per token.

    python -m fleetcast.bench.testserver --port 8011 --ttft-ms 40 --itl-ms 8 --cpu 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

from fleetcast.bench import kstamp

_clock = time.perf_counter
MODEL_ID = "fleetcast-testserver"
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@dataclass
class Timings:
    ttft_ms: float = 40.0
    ttft_jitter_ms: float = 0.0
    itl_ms: float = 8.0
    itl_jitter_ms: float = 0.0
    spike_prob: float = 0.0
    spike_ms: float = 0.0
    seed: int = 0
    fail_prob: float = 0.0  # share of generation requests answered 500, to exercise error accounting
    # Requests whose max_tokens exceed this are refused with 400 in TensorRT-LLM's error shape
    # (tensorrt_llm/serve/openai_protocol.py ErrorResponse: message at the top level), to
    # exercise keeping the server's error text. None: no limit.
    max_output_tokens: int | None = None
    # Models served, each with its own (ttft_ms, itl_ms); empty: one model (MODEL_ID) answering any `model`.
    models: tuple[tuple[str, float, float], ...] = ()


@dataclass
class TruthRecord:
    arrival: float
    prompt_tokens: int
    stream: bool = True
    model: str = MODEL_ID
    emits: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = {"prompt_tokens": self.prompt_tokens, "output_tokens": len(self.emits), "arrival": self.arrival,
               "stream": self.stream, "model": self.model}
        if self.emits:
            ttft = (self.emits[0] - self.arrival) * 1000.0
            e2e = (self.emits[-1] - self.arrival) * 1000.0
            out.update(ttft_ms=ttft, e2e_ms=e2e)
            out["itl_ms"] = (e2e - ttft) / (len(self.emits) - 1) if len(self.emits) > 1 else None
            out["gaps_ms"] = [(b - a) * 1000.0 for a, b in zip(self.emits, self.emits[1:])]
        return out


class TestServerState:
    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.rng = random.Random(timings.seed)
        self.truth: list[TruthRecord] = []
        self.active = 0
        self.by_model = {m: (ttft, itl) for m, ttft, itl in timings.models}

    def model_ids(self) -> list[str]:
        return list(self.by_model) or [MODEL_ID]

    def ttft_s(self, model: str = MODEL_ID) -> float:
        t = self.timings
        base = self.by_model.get(model, (t.ttft_ms, t.itl_ms))[0]
        return max(0.0, base + self.rng.uniform(0, t.ttft_jitter_ms)) / 1000.0

    def gap_s(self, model: str = MODEL_ID) -> float:
        t = self.timings
        gap = self.by_model.get(model, (t.ttft_ms, t.itl_ms))[1] + self.rng.uniform(-t.itl_jitter_ms, t.itl_jitter_ms)
        if t.spike_prob and self.rng.random() < t.spike_prob:
            gap += t.spike_ms
        return max(0.0, gap) / 1000.0


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Http(kstamp.StampedProtocol):
    """One client connection: parses requests (keep-alive), dispatches them (rx_time: the kernel receive time of
    the latest read, under kstamp)."""

    def __init__(self, state: TestServerState) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: kstamp's or asyncio's SSL one.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        # The kernel's receive time: the request's arrival even if this process was slow to wake.
        arrival = self.rx_time if self.rx_time is not None else _clock()
        self.buf += data
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        lines = head.split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0") or 0)
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        try:
            method, path, _ = lines[0].split(" ", 2)
        except ValueError:
            self._respond(400, {"error": {"message": "bad request line"}})
            return
        self.busy = True
        asyncio.get_running_loop().create_task(self._handle(method, path.split("?")[0], body, arrival))

    def _respond(self, status: int, obj: object) -> None:
        payload = json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "Error")
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (status, reason.encode(), len(payload), payload)
            )

    async def _handle(self, method: str, path: str, body: bytes, arrival: float) -> None:
        try:
            if method == "GET" and path in ("/health", "/v1/health"):
                self._respond(200, {"status": "ok"})
            elif method == "GET" and path == "/v1/models":
                self._respond(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fleetcast"}
                                                               for m in self.state.model_ids()]})
            elif method == "GET" and path == "/_truth":
                self._respond(200, [r.summary() for r in self.state.truth])
            elif method == "POST" and path == "/_truth/reset":
                self.state.truth.clear()
                self._respond(200, {"reset": True})
            elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                await self._generate(path.endswith("chat/completions"), body, arrival)
            else:
                self._respond(404, {"error": {"message": f"no route {method} {path}"}})
        finally:
            self.busy = False
            if self.buf and self.transport is not None:
                self.data_received(b"")

    async def _generate(self, chat: bool, body: bytes, arrival: float) -> None:
        try:
            req = json.loads(body)
            if chat:
                prompt = " ".join(str(m.get("content", "")) for m in req["messages"])
            else:
                prompt = req["prompt"]
                if isinstance(prompt, list):
                    prompt = " ".join(str(p) for p in prompt)
            n_out = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._respond(400, {"error": {"message": f"bad request body: {exc}"}})
            return
        state = self.state
        model = req.get("model") if state.by_model else MODEL_ID
        if model not in state.model_ids():
            # The gateway's answer (runtime/gateway/admission.py model_not_found).
            self._respond(404, {"error": {"message": f"The model `{str(model)[:256]}` does not exist or you do not "
                                                     "have access to it.", "type": "invalid_request_error",
                                          "param": None, "code": "model_not_found"}})
            return
        limit = state.timings.max_output_tokens
        if limit is not None and n_out > limit:
            self._respond(400, {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                                "message": f"max_tokens ({n_out}) exceeds this server's limit of {limit} output tokens"})
            return
        if req.get("stream") and state.timings.fail_prob and state.rng.random() < state.timings.fail_prob:
            self._respond(500, {"error": {"message": "injected failure", "type": "InternalServerError"}})
            return
        record = TruthRecord(arrival=arrival, prompt_tokens=len(prompt.split()), stream=bool(req.get("stream")),
                             model=model)
        state.truth.append(record)
        state.active += 1
        try:
            if req.get("stream"):
                await self._stream(chat, req, n_out, record)
            else:
                await asyncio.sleep(state.ttft_s(model) + sum(state.gap_s(model) for _ in range(n_out - 1)))
                record.emits = [_clock()] * n_out
                text = "".join(" " + _WORDS[i % len(_WORDS)] for i in range(n_out))
                choice = {"index": 0, "finish_reason": "length"}
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                self._respond(200, {
                    "id": "cmpl-test", "object": "chat.completion" if chat else "text_completion", "model": model,
                    "choices": [choice],
                    "usage": {"prompt_tokens": record.prompt_tokens, "completion_tokens": n_out,
                              "total_tokens": record.prompt_tokens + n_out},
                })
        finally:
            state.active -= 1

    async def _stream(self, chat: bool, req: dict[str, Any], n_out: int, record: TruthRecord) -> None:
        state = self.state
        model = record.model
        if self.transport is None:
            return  # the client went away before the response began
        write = self.transport.write
        write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
        kind = "chat.completion.chunk" if chat else "text_completion"
        if chat:  # role first, empty content: clients must not count it as the first token
            write(_chunk(_sse({"id": "c", "object": kind, "model": model,
                               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})))
        delay = state.ttft_s(model)
        for i in range(n_out):
            await asyncio.sleep(delay)
            if self.transport is None:
                return  # client went away
            word = " " + _WORDS[i % len(_WORDS)]
            last = i == n_out - 1
            choice: dict[str, object] = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": word}} if chat else {"text": word})
            frame = _chunk(_sse({"id": "c", "object": kind, "model": model, "choices": [choice]}))
            # Stamped just before the write: on loopback the kernel hands the bytes to the
            # client inside this call, so a correct client can never report an earlier time.
            record.emits.append(_clock())
            write(frame)
            delay = state.gap_s(model)
        tail = b""
        if (req.get("stream_options") or {}).get("include_usage"):
            tail += _sse({"id": "c", "object": kind, "model": model, "choices": [],
                          "usage": {"prompt_tokens": record.prompt_tokens, "completion_tokens": n_out,
                                    "total_tokens": record.prompt_tokens + n_out}})
        tail += b"data: [DONE]\n\n"
        write(_chunk(tail) + b"0\r\n\r\n")


async def serve(host: str, port: int, timings: Timings, ready: asyncio.Event | None = None,
                tls: tuple[str, str] | None = None) -> None:
    state = TestServerState(timings)
    loop = asyncio.get_running_loop()
    if tls:
        # TLS goes through asyncio's SSL transport: arrivals are then stamped on the clock.
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*tls)
        server = await loop.create_server(lambda: _Http(state), host, port, ssl=ctx, reuse_address=True)
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()
        return
    lsock = await kstamp.serve(loop, host, port, lambda: _Http(state))
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        loop.remove_reader(lsock.fileno())
        lsock.close()


def _served_model(spec: str, ttft_ms: float, itl_ms: float, parser: argparse.ArgumentParser) -> tuple[str, float, float]:
    model, sep, times = spec.partition("=")
    if not sep:
        return model, ttft_ms, itl_ms
    try:
        ttft, itl = (float(x) for x in times.split("/"))
    except ValueError:
        parser.error(f"--serve-model {spec!r}: use ID or ID=TTFT_MS/ITL_MS")
    return model, ttft, itl


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetcast.bench.testserver", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--ttft-ms", type=float, default=40.0)
    p.add_argument("--ttft-jitter-ms", type=float, default=0.0, help="uniform extra TTFT in [0, J]")
    p.add_argument("--itl-ms", type=float, default=8.0)
    p.add_argument("--itl-jitter-ms", type=float, default=0.0, help="uniform gap jitter in [-J, +J]")
    p.add_argument("--spike-prob", type=float, default=0.0, help="probability a gap gets --spike-ms added")
    p.add_argument("--spike-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-prob", type=float, default=0.0, help="share of requests answered 500")
    p.add_argument("--max-output-tokens", type=int, default=None,
                   help="answer 400 (TensorRT-LLM's error shape) when max_tokens exceeds this")
    p.add_argument("--serve-model", action="append", default=[], metavar="ID[=TTFT_MS/ITL_MS]",
                   help="serve this model id (repeatable), with its own timings (default --ttft-ms/--itl-ms); "
                        "other ids then get 404 model_not_found")
    p.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU core")
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--tls-key", help="private key (PEM) for --tls-cert")
    a = p.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    timings = Timings(a.ttft_ms, a.ttft_jitter_ms, a.itl_ms, a.itl_jitter_ms, a.spike_prob, a.spike_ms, a.seed, a.fail_prob,
                      a.max_output_tokens, tuple(_served_model(x, a.ttft_ms, a.itl_ms, p) for x in a.serve_model))
    scheme = "https" if a.tls_cert else "http"
    print(f"testserver on {scheme}://{a.host}:{a.port} {timings}", file=sys.stderr, flush=True)
    try:
        asyncio.run(serve(a.host, a.port, timings, tls=(a.tls_cert, a.tls_key) if a.tls_cert else None))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
