"""The measuring HTTP client: streamed completions over raw asyncio transports.

Timestamps: on plain TCP each read carries the kernel's receive time
(SO_TIMESTAMPNS, fleetcast.bench.kstamp), so a client that is busy or
descheduled when bytes arrive still reports when they arrived; over TLS reads
are stamped with the clock on arrival in `data_received`.

Why not aiohttp for the measured requests: an `async for` over a response
wakes a coroutine (futures, task steps) for every streamed chunk, and at 64
concurrent streams that per-token overhead is what saturates a one-core client
first. Here each connection is an `asyncio.Protocol`; `data_received` is a
plain callback that does the minimum per network read: one clock read, one
list append, and HTTP/1.1 framing arithmetic to notice the end of the response.
Decoding (chunked encoding, SSE, JSON) happens after the run, from the stored
bytes and their arrival times (`parse_stream`), so it never competes with
timestamping. An SSE event's arrival time is the arrival time of the network
read holding its last byte.

One connection carries one request at a time and is kept alive for the next
(HTTP/1.1 keep-alive), like an OpenAI client with a connection pool. TLS works
through `ssl=` on the transport. Control-plane calls (model discovery, prompt
calibration) use blocking urllib in a thread: they are not timed.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import socket
import ssl as ssl_module
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

from fleetcast.bench import kstamp
from fleetcast.contract.errors import UserError

_clock = time.perf_counter
# A kernel-stamped read processed later than this after the data arrived may
# have gathered events that arrived at different times.
LATE_READ_S = 0.001


@dataclass
class Endpoint:
    """Where requests go: parsed once from the --endpoint URL."""

    url: str
    host: str
    port: int
    tls: bool
    base_path: str  # "" or "/prefix", without the trailing /v1

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--endpoint: {url!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:8000")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(url=url, host=parts.hostname, port=port, tls=parts.scheme == "https", base_path=path)

    def path(self, api_path: str) -> str:
        return f"{self.base_path}{api_path}"


@dataclass
class RawResponse:
    """What the protocol captured for one request: bytes and when they arrived."""

    t_send: float
    reads: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    t_done: float | None = None
    error: str | None = None  # transport-level error type, None when the response completed
    # Per read, how long after its kernel receive time the client processed it
    # (kernel-stamped reads only): a late read may have merged several events.
    lateness: list[float] = field(default_factory=list)
    # The event-loop thread's run-queue wait so far (ns, schedstat), read just
    # before the send stamp and after each read: the wait between the two is
    # time the OS kept the client off a CPU while this request was timed.
    rq_send: int | None = None
    rq_reads: list[int | None] = field(default_factory=list)


class _Connection(kstamp.StampedProtocol):
    """One keep-alive HTTP/1.1 connection; one request in flight at a time (rx_time: the current read's kernel
    receive time, when the transport has it)."""

    rq_wait: Callable[[], int | None] | None = None  # the loop thread's run-queue wait (ns), when measured

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._raw: RawResponse | None = None
        self._done: asyncio.Future[None] | None = None

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: loop.create_connection's or kstamp's (uvloop's need not subclass asyncio.Transport).
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Small SSE writes must not wait on Nagle's algorithm.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        rx = self.rx_time
        t = rx if rx is not None else _clock()
        raw = self._raw
        if raw is None:
            return  # stray bytes between requests: ignore
        if rx is not None:
            raw.lateness.append(_clock() - rx)
        raw.times.append(t)
        raw.reads.append(data)
        if self.rq_wait is not None and raw.rq_send is not None:
            raw.rq_reads.append(self.rq_wait())  # one per read, None kept: indexes match `times`
        if self._frame(data):
            raw.t_done = t
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        raw = self._raw
        if raw is not None:
            if self._mode == "close" and self._in_body:
                raw.t_done = raw.times[-1] if raw.times else _clock()
            else:
                raw.error = "connection_closed" if exc is None else "connection_error"
            self._finish()

    # -- request
    def start(self, request: bytes, raw: RawResponse, done: asyncio.Future[None]) -> None:
        self._raw = raw
        self._done = done
        self._in_body = False
        self._hbuf = b""
        self._mode = ""
        self._need = 0
        self._line = b""
        self._final = False
        self._keep_alive = True
        if self.rq_wait is not None:
            raw.rq_send = self.rq_wait()
        raw.t_send = _clock()
        assert self.transport is not None, "a request starts on a connected connection"
        self.transport.write(request)

    def _finish(self) -> None:
        done, self._raw, self._done = self._done, None, None
        if done is not None and not done.done():
            done.set_result(None)
        if not self._keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True

    # -- HTTP/1.1 framing: only enough to know where the response ends
    def _frame(self, data: bytes) -> bool:
        if not self._in_body:
            self._hbuf += data
            end = self._hbuf.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = self._hbuf[:end].decode("latin-1").lower()
            data = self._hbuf[end + 4 :]
            self._hbuf = b""
            self._in_body = True
            lines = head.split("\r\n")
            headers = {}
            for header in lines[1:]:
                name, _, value = header.partition(":")
                headers[name.strip()] = value.strip()
            self._keep_alive = headers.get("connection", "") != "close" and lines[0].startswith("http/1.1")
            if "chunked" in headers.get("transfer-encoding", ""):
                self._mode = "chunked"
            elif "content-length" in headers:
                self._mode = "length"
                self._need = int(headers["content-length"])
            else:
                self._mode = "close"
                self._keep_alive = False
        if self._mode == "length":
            self._need -= len(data)
            return self._need <= 0
        if self._mode == "close":
            return False
        pos, n = 0, len(data)
        while pos < n:
            if self._need:
                take = min(self._need, n - pos)
                pos += take
                self._need -= take
                continue
            j = data.find(b"\n", pos)
            if j < 0:
                self._line += data[pos:]
                return False
            line = self._line + data[pos:j]
            self._line = b""
            pos = j + 1
            if self._final:
                if not line.strip():
                    return True
                continue  # a trailer header
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                self._final = True
            else:
                self._need = size + 2
        return False


class ConnectionPool:
    """Idle keep-alive connections to one endpoint, opened on demand."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float = 10.0, ca_bundle: str | None = None,
                 rq_wait: Callable[[], int | None] | None = None) -> None:
        self.endpoint = endpoint
        self.rq_wait = rq_wait
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._all: list[_Connection] = []
        # Certificates are always verified; a private CA (ACM PCA behind an NLB TLS listener) comes in by file.
        self._ssl = ssl_module.create_default_context(cafile=ca_bundle) if endpoint.tls else None
        # Plain TCP reads carry kernel receive times; TLS reads are stamped by the clock.
        self.kernel_stamps = self._ssl is None and kstamp.supported()

    async def acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        if self.kernel_stamps:
            transport, conn = await asyncio.wait_for(
                kstamp.connect(loop, self.endpoint.host, self.endpoint.port, _Connection), self.connect_timeout_s)
            self.kernel_stamps = transport.stamped
            conn.rq_wait = self.rq_wait
            self._all.append(conn)
            return conn
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                _Connection, self.endpoint.host, self.endpoint.port, ssl=self._ssl,
                server_hostname=self.endpoint.host if self._ssl else None,
            ),
            self.connect_timeout_s,
        )
        conn.rq_wait = self.rq_wait
        self._all.append(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        if not conn.closed:
            self._idle.append(conn)

    def close(self) -> None:
        for conn in self._all:
            if conn.transport is not None and not conn.closed:
                conn.transport.close()
        self._idle.clear()
        self._all.clear()


def build_http_request(endpoint: Endpoint, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    host = endpoint.host if endpoint.port in (80, 443) else f"{endpoint.host}:{endpoint.port}"
    lines = [
        f"POST {endpoint.path(path)} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def send_request(pool: ConnectionPool, request: bytes, timeout_s: float) -> RawResponse:
    """Send one request on a pooled connection and wait for the whole streamed response."""
    raw = RawResponse(t_send=_clock())
    try:
        conn = await pool.acquire()
    except (TimeoutError, OSError):
        raw.error = "connect_error"
        raw.t_done = _clock()
        return raw
    done = asyncio.get_running_loop().create_future()
    conn.start(request, raw, done)
    try:
        await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        raw.error = "timeout"
        raw.t_done = _clock()
        conn._raw = None
        if conn.transport is not None:
            conn.transport.close()
        conn.closed = True
        return raw
    pool.release(conn)
    return raw


# ---------------------------------------------------------------- after the run


@dataclass
class ParsedResponse:
    """A response decoded after the run: content-event times and token counts."""

    status: int | None
    content_times: list[float]
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None
    text_chars: int = 0
    # The first content event shared a late read (> LATE_READ_S after its kernel
    # time) with later content events: its true arrival may be earlier than its stamp.
    first_token_merged: bool = False
    # What the server said about a failure: its error message (bounded), when it gave one.
    error_detail: str | None = None


def error_message(body: bytes | str | dict[str, Any] | None) -> str | None:
    """The server's reason for a failed request, at most ERROR_DETAIL_MAX_CHARS characters.

    Reads both error shapes in use: TensorRT-LLM's `ErrorResponse` puts `message` at the top
    level (`{"object": "error", "message": ..., "type": ..., "code": 400}`,
    tensorrt_llm/serve/openai_protocol.py), OpenAI and vLLM nest it (`{"error": {"message": ...}}`).
    Anything else (a proxy's text or HTML page) is kept as text, whitespace collapsed."""
    from fleetcast.bench.schema import ERROR_DETAIL_MAX_CHARS

    if body is None:
        return None
    obj = body
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            obj = json.loads(text)
        except ValueError:
            obj = text
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            obj = err["message"]
        elif obj.get("message"):
            obj = obj["message"]
        elif isinstance(err, str) and err:
            obj = err
        elif obj.get("detail"):  # FastAPI's default error body
            obj = obj["detail"]
    text = " ".join(str(obj).split())
    if not text:
        return None
    return text if len(text) <= ERROR_DETAIL_MAX_CHARS else text[: ERROR_DETAIL_MAX_CHARS - 3] + "..."


def _dechunk(body: bytes, base: int) -> tuple[bytes, list[tuple[int, int]]]:
    """Decode chunked transfer encoding. Returns the payload and, per payload
    segment, (payload_end, raw_end) offsets so payload positions map back to reads."""
    out = []
    spans = []
    pos, total = 0, 0
    n = len(body)
    while pos < n:
        j = body.find(b"\r\n", pos)
        if j < 0:
            break
        size = int(body[pos:j].split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        start = j + 2
        out.append(body[start : start + size])
        total += size
        spans.append((total, base + start + size))
        pos = start + size + 2
    return b"".join(out), spans


def parse_stream(raw: RawResponse, api: str) -> ParsedResponse:
    """Decode one captured response: HTTP status, SSE events, content timing, usage."""
    if not raw.reads:
        return ParsedResponse(None, [], None, None, raw.error or "no_response")
    data = b"".join(raw.reads)
    ends = []
    acc = 0
    for chunk in raw.reads:
        acc += len(chunk)
        ends.append(acc)
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return ParsedResponse(None, [], None, None, raw.error or "bad_http_response")
    head = data[:head_end].decode("latin-1")
    status_line = head.split("\r\n", 1)[0].split()
    try:
        status = int(status_line[1])
    except (IndexError, ValueError):
        return ParsedResponse(None, [], None, None, "bad_http_response")
    body_start = head_end + 4
    if "chunked" in head.lower():
        payload, spans = _dechunk(data[body_start:], body_start)
    else:
        payload = data[body_start:]
        spans = [(len(payload), body_start + len(payload))]
    if status != 200:
        return ParsedResponse(status, [], None, None, f"http_{status}", error_detail=error_message(payload))

    span_ends = [s[0] for s in spans]

    def read_at(payload_end: int) -> int:
        # Map a payload offset to the raw offset, then to the read that delivered it.
        k = min(bisect.bisect_left(span_ends, payload_end), len(spans) - 1)
        seg_payload_end, seg_raw_end = spans[k]
        raw_pos = seg_raw_end - (seg_payload_end - payload_end)
        return min(bisect.bisect_left(ends, raw_pos), len(raw.times) - 1)

    content_reads: list[int] = []

    content_times: list[float] = []
    prompt_tokens = completion_tokens = None
    error = raw.error
    detail = None
    chars = 0
    saw_done = False
    # SSE events end with a blank line; servers use either LF or CRLF line ends.
    sep = b"\r\n\r\n" if b"\r\n\r\n" in payload else b"\n\n"
    pos = 0
    while True:
        end = payload.find(sep, pos)
        if end < 0:
            break
        event = payload[pos:end]
        event_end = end + len(sep)
        pos = event_end
        data_lines = [ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")]
        if not data_lines:
            continue
        body = b"\n".join(data_lines)
        if body == b"[DONE]":
            saw_done = True
            continue
        try:
            obj = json.loads(body)
        except ValueError:
            error = error or "bad_sse_json"
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("error") or obj.get("object") == "error":
            if error is None:
                error, detail = "stream_error", error_message(obj)
            continue
        usage = obj.get("usage")
        if usage:
            prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
            completion_tokens = usage.get("completion_tokens", completion_tokens)
        for choice in obj.get("choices") or ():
            if api == "chat":
                content = (choice.get("delta") or {}).get("content")
            else:
                content = choice.get("text")
            if content:
                chars += len(content)
                r = read_at(event_end)
                content_reads.append(r)
                content_times.append(raw.times[r])
                break
    merged = (
        len(content_reads) > 1 and content_reads[0] == content_reads[1] and len(raw.lateness) > content_reads[0]
        and raw.lateness[content_reads[0]] > LATE_READ_S
    )
    if error is None and not saw_done and not content_times:
        error = "empty_response"
    elif error is None and not saw_done:
        error = "incomplete_stream"
    return ParsedResponse(status, content_times, prompt_tokens, completion_tokens, error, chars, merged, detail)


def http_json(method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str], timeout_s: float = 60.0,
              ca_bundle: str | None = None) -> tuple[int, Any]:
    """One blocking JSON request (control plane only). Returns (status, parsed body or text).
    Raises OSError when the endpoint cannot be reached."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        ctx = ssl_module.create_default_context(cafile=ca_bundle) if url.startswith("https") else None
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from None
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode("utf-8", "replace")


async def tcp_rtt_ms(endpoint: Endpoint, samples: int = 7, timeout_s: float = 5.0) -> float | None:
    """Median TCP connect time to the endpoint: one network round trip (SYN, SYN-ACK)."""
    loop = asyncio.get_running_loop()
    values = []
    try:
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    family, _, _, _, addr = infos[0]
    for _ in range(samples):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        t0 = _clock()
        try:
            await asyncio.wait_for(loop.sock_connect(sock, addr), timeout_s)
            values.append((_clock() - t0) * 1000.0)
        except (TimeoutError, OSError):
            pass
        finally:
            sock.close()
        await asyncio.sleep(0.01)
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]
