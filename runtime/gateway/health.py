"""/health: the model server's own /health, over one kept-alive loopback connection.

NLB health checks arrive from every load balancer node all day; a connection per
check left thousands of sockets in TIME_WAIT. Checks that arrive while one is in
flight share its answer.

An instance that serves several models runs one engine process per (model, copy); the
runtime keeps their readiness in a small JSON file (runtime/serve.py, `--models-state`).
With it, /health says which models are ready and stays 200 while any one is: a model
whose process is restarting must not take the instance out of the load balancer, which
would stop the others too (its own requests fail fast meanwhile).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from .http import READ_SIZE, ChunkedDecoder, parse_response_head, response_head
from .upstream import UpstreamConn

MAX_HEALTH_BODY = 64 * 1024  # a /health answer longer than this is not read to the end: the connection is dropped


class HealthProbe:
    def __init__(self, upstream: tuple[str, int], timeout_s: float, draining: Callable[[], bool] = lambda: False,
                 models_state: str | None = None):
        self.upstream = upstream
        self.timeout_s = timeout_s
        self.draining = draining
        self.models_state = models_state  # the runtime's per-model readiness file, when it writes one
        self._conn: UpstreamConn | None = None  # one kept-alive connection for /health checks
        self._probe: asyncio.Future[tuple[int, dict[str, Any]]] | None = None  # the check in flight; concurrent ones share it

    async def response(self, head_only: bool, keep: bool) -> bytes:
        """The gateway's whole /health answer: 503 while draining, else the server's verdict."""
        if self.draining():
            status, body = 503, {"status": "draining"}
        else:
            status, body = await self.verdict()
        payload = json.dumps(body).encode()
        out = response_head(status, [("Content-Type", "application/json")], length=len(payload), close=not keep)
        return out if head_only else out + payload

    async def verdict(self) -> tuple[int, dict[str, Any]]:
        """Per model when the runtime reports its processes: 200 while any model is ready; else the
        model server's own /health."""
        models = self.read_models()
        if models is None:
            return await self.check()
        ready = {model: bool(state.get("ready")) for model, state in models.items()}
        if any(ready.values()):
            return 200, {"status": "ok", "models": ready}
        return 503, {"status": "unhealthy", "reason": "no model is ready", "models": ready}

    def read_models(self) -> dict[str, dict[str, Any]] | None:
        """The runtime's file ({"models": {id: {"ready": bool, ...}}}), or None without a usable one."""
        if not self.models_state:
            return None
        try:
            with open(self.models_state, "rb") as f:
                data = json.loads(f.read(MAX_HEALTH_BODY))
        except (OSError, ValueError):
            return None  # not written yet (the first process is still starting): the server's own answer
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict) or not models or not all(isinstance(v, dict) for v in models.values()):
            return None
        return models

    async def check(self) -> tuple[int, dict[str, Any]]:
        """The model server's /health; checks that arrive while one is in flight share its answer."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._run())
        # Shielded: a caller that goes away must not cancel the probe the others wait for.
        return await asyncio.shield(self._probe)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.writer.close()
            self._conn = None

    async def _run(self) -> tuple[int, dict[str, Any]]:
        """One GET /health over the kept-alive connection; a fresh one when the server had closed it
        (trtllm-serve closes idle connections after a few seconds), retried once when that happens mid-send."""
        conn, self._conn = self._conn, None
        for attempt in (0, 1):
            if conn is None or conn.reader.at_eof() or conn.writer.is_closing():
                if conn is not None:
                    conn.writer.close()
                try:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.timeout_s)
                except (TimeoutError, OSError) as exc:
                    return 503, {"status": "unhealthy", "reason": f"model server unreachable: {type(exc).__name__}"}
                conn = UpstreamConn(reader, writer)
            else:
                conn.reused = True
            try:
                conn.writer.write(f"GET /health HTTP/1.1\r\nHost: {self.upstream[0]}:{self.upstream[1]}\r\n\r\n"
                                  .encode())
                status, reusable = await asyncio.wait_for(_answer(conn), self.timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                conn.writer.close()
                if conn.reused and attempt == 0 and not getattr(exc, "partial", b""):
                    conn = None
                    continue  # the server had closed the idle connection: once more on a new one
                return 503, {"status": "unhealthy", "reason": f"model server health check failed: {type(exc).__name__}"}
            except (TimeoutError, OSError, asyncio.LimitOverrunError, ValueError) as exc:
                conn.writer.close()
                return 503, {"status": "unhealthy", "reason": f"model server health check failed: {type(exc).__name__}"}
            if reusable and not self.draining():
                self._conn = conn
            else:
                conn.writer.close()
            if status == 200:
                return 200, {"status": "ok"}
            return 503, {"status": "unhealthy", "reason": f"model server /health answered {status}"}
        raise AssertionError("unreachable")  # pragma: no cover


async def _answer(conn: UpstreamConn) -> tuple[int, bool]:
    """Status of the /health answer, its body read to the end; True when the connection can be reused."""
    raw = await conn.reader.readuntil(b"\r\n\r\n")
    status, headers = parse_response_head(raw)
    lower = {k.lower(): v for k, v in headers}
    reusable = "close" not in lower.get("connection", "").lower()
    if "chunked" in lower.get("transfer-encoding", "").lower():
        decoder, size = ChunkedDecoder(), 0
        while not decoder.done:
            data = await conn.reader.read(READ_SIZE)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            size += len(decoder.feed(data))
            if size > MAX_HEALTH_BODY:
                return status, False
    elif "content-length" in lower:
        length = int(lower["content-length"])
        if length > MAX_HEALTH_BODY:
            return status, False
        await conn.reader.readexactly(length)
    else:
        reusable = False  # the body ends when the server closes
    return status, reusable
