"""Loopback doubles for the gateway tests: an OpenAI-shaped streaming server and a PROXY v2 client.

The fake server behaves like trtllm-serve where it matters to the gateway:
chunked SSE with one event per token, a usage-only final event only when the
request asks for `stream_options.include_usage`, `[DONE]` at the end, and
/health; replies name the model `engine`, as trtllm-serve names it after its model directory
(OpenAIServer: `self.model = model_dir.name`, tensorrt_llm/serve/openai_server.py), and every other
path answers 200, as an engine's routes beyond the gateway's would. Tests can hold streams open (`gate`) to create in-flight load, and hold
non-streaming requests (`hold`) the way a long generation does: like trtllm-serve
(OpenAIServer.await_disconnected, tensorrt_llm/serve/openai_server.py) the server aborts a
held request as soon as its connection closes, and counts it in `cancelled`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from runtime.gateway import ppv2
from runtime.gateway.http import ChunkedDecoder


def token_text(i: int) -> str:
    return f" t{i}"


_ANSWER: list[str] = [""]  # the tokens' text so far
_ANSWER_ENDS: list[int] = [0]  # where each token ends in it


def completion_text(n: int) -> str:
    """A non-streaming answer of n tokens (the same text every time). Every answer is a prefix of the longest, so
    one text grows and answers are cut from it: built per length, a thousand lengths of 1000-2000 tokens
    (tests/traffic) cost 1.5 million token strings."""
    ends = _ANSWER_ENDS
    if n >= len(ends):
        pieces = [token_text(i) for i in range(len(ends) - 1, max(n, 2 * len(ends)))]
        for piece in pieces:
            ends.append(ends[-1] + len(piece))
        _ANSWER[0] += "".join(pieces)
    return _ANSWER[0][:ends[n]]


class FakeModelServer:
    """`max_tokens` tokens per request; prompt tokens = words in the prompt."""

    SERVED_NAME = "engine"

    def __init__(self, token_delay_s: float = 0.0):
        self.token_delay_s = token_delay_s
        self.seen: list[tuple[str, str]] = []  # (method, path) of every request that reached the server
        self.healthy = True
        self.requests: list[dict[str, Any]] = []  # bodies as the server received them
        self.gate: asyncio.Event | None = None  # when set up, streams wait on it after the first token
        self.hold: asyncio.Event | None = None  # when set up, requests wait on it before their first token
        self.held = asyncio.Event()  # set when a non-streaming request starts waiting on `hold`
        self.arrivals = 0  # inference requests that reached the server, readable or not
        self.cancelled = 0
        self.active = 0
        self.completed_output_tokens = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> FakeModelServer:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_route("*", "/{tail:.*}", self._other)  # last: what no route above takes
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append((request.method, request.path))
        return await handler(request)

    async def _other(self, request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "answered_by": "engine"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gpt2-xl", "object": "model"}]})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.arrivals += 1
        body = await request.json()
        self.requests.append(body)
        chat = request.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n_in, n_out = len(prompt.split()), int(body.get("max_tokens", 4))
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        if not body.get("stream"):
            if self.hold is not None and not await self._held(request):
                self.cancelled += 1
                raise ConnectionResetError("client disconnected")
            text = completion_text(n_out)
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else \
                {"index": 0, "text": text}
            self.completed_output_tokens += n_out
            return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": self.SERVED_NAME,
                                      "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.hold is not None and not await self._held(request):  # a long prefill: headers out, no token yet
            self.cancelled += 1
            raise ConnectionResetError("client disconnected")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.active += 1
        try:
            if chat:  # trtllm-serve opens a chat stream with a role-only delta
                await response.write(_event({"model": self.SERVED_NAME,
                                             "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
            for i in range(n_out):
                piece = {"index": 0, "delta": {"content": token_text(i)}} if chat else \
                    {"index": 0, "text": token_text(i)}
                await response.write(_event({"id": "cmpl-1", "model": self.SERVED_NAME, "choices": [piece],
                                             "usage": None}))
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
            if include_usage:
                await response.write(_event({"id": "cmpl-1", "model": self.SERVED_NAME, "choices": [],
                                             "usage": usage}))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self.completed_output_tokens += n_out
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        return response


    async def _held(self, request: web.Request) -> bool:
        """Wait for `hold`; False when the connection closed first (the generation is aborted)."""
        self.active += 1
        self.held.set()
        try:
            while not self.hold.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    return False
                try:
                    await asyncio.wait_for(self.hold.wait(), 0.02)
                except TimeoutError:
                    pass
            return True
        finally:
            self.active -= 1


class CountingHealthServer:
    """A /health endpoint that counts the connections it accepts; keep-alive like uvicorn, or
    closing after each answer (`close_after_answer`, with or without saying so)."""

    def __init__(self, close_after_answer: bool = False, announce_close: bool = True):
        self.close_after_answer = close_after_answer
        self.announce_close = announce_close
        self.connections = 0
        self.checks = 0
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> CountingHealthServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening and close every open connection (the server process died)."""
        if self._server:
            self._server.close()
        for writer in list(self._open):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.checks += 1
                close = self.close_after_answer or b"connection: close" in head.lower()
                header = b"Connection: close\r\n" if close and self.announce_close else b""
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + header
                             + b"Content-Length: 2\r\n\r\n{}")
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    events: list[dict[str, Any] | str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        """Concatenated streamed or returned text."""
        out = []
        for ev in self.events:
            if isinstance(ev, dict):
                for c in ev.get("choices", []):
                    out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        return "".join(out)


class Client:
    """One TCP connection to the gateway that starts with a PROXY v2 header, then speaks HTTP/1.1."""

    def __init__(self, port: int, vpce_id: str | None = "vpce-0aaaaaaaaaaaaaaa1", header: bytes | None = None):
        self.port = port
        self.header = header if header is not None else ppv2.build(vpce_id=vpce_id) if vpce_id else ppv2.LOCAL_HEADER
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> Client:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.header)
        return self

    async def close(self) -> None:
        if self.writer:
            self.writer.close()

    async def send(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> None:
        if self.writer is None:
            await self.connect()
        raw = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {path} HTTP/1.1", "Host: gateway"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(raw)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)

    async def read_head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode().split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers

    async def read_body(self, headers: dict[str, str], on_chunk=None) -> bytes:
        if "chunked" in headers.get("transfer-encoding", ""):
            decoder, out = ChunkedDecoder(), []
            while not decoder.done:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("stream ended before the last chunk")
                piece = decoder.feed(data)
                out.append(piece)
                if on_chunk and piece:
                    await on_chunk(piece)
            return b"".join(out)
        if "content-length" in headers:
            return await self.reader.readexactly(int(headers["content-length"]))
        return await self.reader.read()

    async def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                      on_chunk=None) -> Reply:
        await self.send(method, path, body, headers)
        status, head = await self.read_head()
        data = await self.read_body(head, on_chunk)
        return Reply(status, head, data, parse_sse(data) if "event-stream" in head.get("content-type", "") else [])


def parse_sse(data: bytes) -> list[dict[str, Any] | str]:
    events = []
    for block in data.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                payload = line[6:]
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


async def one_request(port: int, method: str, path: str, body: Any = None, vpce_id: str | None = "vpce-0aaaaaaaaaaaaaaa1",
                      headers: dict[str, str] | None = None, header: bytes | None = None) -> Reply:
    client = await Client(port, vpce_id, header).connect()
    try:
        return await client.request(method, path, body, headers)
    finally:
        await client.close()
