"""The small slice of HTTP/1.1 the gateway needs, over asyncio streams.

The gateway speaks to two known parties: OpenAI-compatible clients and the
local trtllm-serve (or the reference backend). That lets it be a plain
streaming proxy that copies bytes as they arrive instead of a web framework
that buffers and re-encodes: each upstream read becomes one client write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the gateway rewrites itself.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
    "proxy-authenticate", "proxy-authorization", "content-length", "expect",
})

REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}


class HttpError(Exception):
    """A request the gateway cannot read; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    lower: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        conn = self.lower.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    @property
    def chunked(self) -> bool:
        return "chunked" in self.lower.get("transfer-encoding", "").lower()


def parse_head(head: bytes) -> Request:
    """Request line and headers (the bytes up to and including the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "malformed request line")
    headers, lower = [], {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        value = value.strip()
        headers.append((name, value))
        key = name.lower()
        lower[key] = f"{lower[key]}, {value}" if key in lower else value
    return Request(parts[0], parts[1], parts[2], headers, lower)


def body_length(lower: dict[str, str]) -> int:
    raw = lower.get("content-length")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise HttpError(400, "malformed Content-Length")
    length = int(raw)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
    return length


class ChunkedError(ValueError):
    pass


class ChunkedDecoder:
    """Incremental decoder for chunked transfer coding: feed raw bytes, get payload bytes back."""

    _SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = self._SIZE
        self._remaining = 0

    @property
    def done(self) -> bool:
        return self._state == self._DONE

    def feed(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        out = bytearray()
        while True:
            if self._state == self._DATA:
                take = min(self._remaining, len(buf))
                if not take:
                    break
                out += buf[:take]
                del buf[:take]
                self._remaining -= take
                if not self._remaining:
                    self._state = self._CRLF
            elif self._state == self._SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ChunkedError("chunk size line too long")
                    break
                line = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise ChunkedError(f"bad chunk size {line[:20]!r}") from None
                if size < 0:
                    raise ChunkedError("negative chunk size")
                if size:
                    self._state, self._remaining = self._DATA, size
                else:
                    self._state = self._TRAILER
            elif self._state == self._CRLF:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ChunkedError("chunk not followed by CRLF")
                del buf[:2]
                self._state = self._SIZE
            elif self._state == self._TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ChunkedError("trailer too long")
                    break
                empty = end == 0
                del buf[: end + 2]
                if empty:
                    self._state = self._DONE
            else:  # done: ignore anything after the last chunk
                buf.clear()
                break
        return bytes(out)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def openai_error(status: int, message: str, error_type: str, code: str | None,
                 extra_headers: list[tuple[str, str]] | None = None, close: bool = False) -> bytes:
    """A complete HTTP response carrying an OpenAI-shaped error body."""
    body = json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}}).encode()
    return response_head(status, [("Content-Type", "application/json")] + (extra_headers or []),
                         length=len(body), close=close) + body


def response_head(status: int, headers: list[tuple[str, str]], *, length: int | None = None,
                  chunked: bool = False, close: bool = False, reason: str | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close" if close else "Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
