"""A small asyncio HTTP/1.1 client for `dschat serve`'s benchmark and tests: raw sockets, one
connection per request, and a streaming chat reader that checks every SSE chunk against OpenAI's
format (tests/serve/load_test.py and benchmarks/serve_load.py use it).
"""
import asyncio
import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass, field

DEFAULT_PROMPT = "Tell me a short story about a cat."


# ----------------------------------------------------------------------------------------------
# A minimal HTTP/1.1 client on asyncio streams (no dependency; cheap enough for 64 streams)

def split_url(base):
    parts = urllib.parse.urlsplit(base)
    return parts.hostname or "127.0.0.1", parts.port or 80


def build_request(host, port, method, path, body=None, headers=None):
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    for key, value in (headers or {}).items():
        head.append(f"{key}: {value}")
    if body is not None:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


async def read_head(reader):
    """-> (status int, headers dict with lower-case names)."""
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return int(status_line[1]), headers


async def iter_body(reader, headers):
    """The body's bytes as they arrive: chunked, Content-Length, or until the server closes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def http_call_async(base, method, path, body=None, headers=None, timeout=30.0):
    """-> (status, headers, body bytes). body: bytes, or a JSON-able object."""
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
        headers = dict({"Content-Type": "application/json"}, **(headers or {}))

    async def go():
        host, port = split_url(base)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(build_request(host, port, method, path, body, headers))
            await writer.drain()
            status, response_headers = await read_head(reader)
            data = b"".join([chunk async for chunk in iter_body(reader, response_headers)])
            return status, response_headers, data
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


def http_call(base, method, path, body=None, headers=None, timeout=30.0):
    """Blocking: -> (status, headers, body bytes). body: bytes, or a JSON-able object."""
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
        headers = dict({"Content-Type": "application/json"}, **(headers or {}))
    host, port = split_url(base)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=dict({"Connection": "close"}, **(headers or {})))
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def get_json(base, path, timeout=10.0):
    status, _, body = http_call(base, "GET", path, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {path} -> {status}: {body[:300]!r}")
    return json.loads(body)


# ----------------------------------------------------------------------------------------------
# One streamed chat request

@dataclass
class StreamResult:
    status: object = None          # HTTP status, or "timeout" / "conn:<Error>" when there was none
    ok: bool = False               # 200, well-formed SSE, a finish_reason, ending in [DONE]
    done: bool = False             # saw data: [DONE]
    closed_early: bool = False     # the client closed after close_after_chunks content chunks
    start: float = 0.0             # time.monotonic() when the request was sent
    latency_s: float = None        # to [DONE] (ok requests) or to the end of the response
    ttft_s: float = None           # to the first non-empty content delta
    content_chunks: int = 0        # chunks with non-empty delta content
    usage: dict = None             # the include_usage chunk's usage
    finish_reason: str = None
    text: str = ""
    error: dict = None             # the error object of a non-200 response
    problems: list = field(default_factory=list)  # contract violations seen in the stream

    @property
    def completion_tokens(self):
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        return self.content_chunks

    @property
    def kind(self):
        """What to count this result as: "200", "429", "timeout", "conn:...", "200-incomplete"."""
        if self.status == 200 and not self.ok and not self.closed_early:
            return "200-incomplete"
        return str(self.status)


def chat_payload(model, prompt=DEFAULT_PROMPT, max_tokens=32, temperature=0.7, include_usage=True, **extra):
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
               "temperature": temperature, "stream": True}
    if include_usage:
        payload["stream_options"] = {"include_usage": True}
    payload.update(extra)
    return payload


def check_chunk(chunk, result):
    """Checks one parsed data event of a chat stream against the contract; records what it carries."""
    if not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk":
        result.problems.append(f"not a chat.completion.chunk: {str(chunk)[:200]}")
        return
    for key in ("id", "created", "model"):
        if key not in chunk:
            result.problems.append(f"chunk without {key!r}: {str(chunk)[:200]}")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        result.problems.append(f"chunk without a choices list: {str(chunk)[:200]}")
        return
    if chunk.get("usage") is not None:
        if choices:
            result.problems.append(f"usage chunk with non-empty choices: {str(chunk)[:200]}")
        result.usage = chunk["usage"]
    for choice in choices:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            result.problems.append(f"choice without a delta object: {str(chunk)[:200]}")
            continue
        content = delta.get("content")
        if content:
            if result.finish_reason is not None:
                result.problems.append("content after the finish_reason")
            result.content_chunks += 1
            result.text += content
            if result.ttft_s is None:
                result.ttft_s = time.monotonic() - result.start
        if choice.get("finish_reason") is not None:
            if choice["finish_reason"] not in ("stop", "length"):
                result.problems.append(f"finish_reason {choice['finish_reason']!r}")
            result.finish_reason = choice["finish_reason"]


async def stream_chat(base, payload, close_after_chunks=None, timeout=120.0, headers=None):
    """POSTs a streaming chat request and reads its SSE to [DONE] (or closes the connection after
    `close_after_chunks` content chunks). Never raises for server or network faults: the outcome
    is in the StreamResult."""
    result = StreamResult()
    body = json.dumps(payload).encode()
    host, port = split_url(base)
    writer = None

    async def go():
        nonlocal writer
        reader, writer = await asyncio.open_connection(host, port)
        result.start = time.monotonic()
        writer.write(build_request(host, port, "POST", "/v1/chat/completions", body,
                                   dict({"Content-Type": "application/json"}, **(headers or {}))))
        await writer.drain()
        result.status, response_headers = await read_head(reader)
        if result.status != 200:
            data = b"".join([chunk async for chunk in iter_body(reader, response_headers)])
            result.latency_s = time.monotonic() - result.start
            try:
                result.error = json.loads(data).get("error")
            except (ValueError, AttributeError):
                result.error = None
            if not isinstance(result.error, dict):
                result.problems.append(f"status {result.status} without an error object: {data[:200]!r}")
            return
        if not response_headers.get("content-type", "").startswith("text/event-stream"):
            result.problems.append(f"Content-Type {response_headers.get('content-type')!r}")
        buffer = b""
        async for data in iter_body(reader, response_headers):
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if result.done:
                    result.problems.append(f"event after [DONE]: {event[:100]!r}")
                    continue
                data_lines = []
                for line in event.decode("utf-8", "replace").split("\n"):
                    if line.startswith("data:"):
                        data_lines.append(line[5:][1:] if line[5:6] == " " else line[5:])
                    elif line and not line.startswith(":"):
                        result.problems.append(f"not an SSE data line: {line[:100]!r}")
                if not data_lines:
                    continue
                text = "\n".join(data_lines)
                if text == "[DONE]":
                    result.done = True
                    result.latency_s = time.monotonic() - result.start
                    continue
                try:
                    check_chunk(json.loads(text), result)
                except ValueError:
                    result.problems.append(f"data is not JSON: {text[:100]!r}")
                if close_after_chunks is not None and result.content_chunks >= close_after_chunks \
                        and result.finish_reason is None:
                    result.closed_early = True
                    return
        if buffer.strip():
            result.problems.append(f"stream ends inside an event: {buffer[:100]!r}")
        if not result.done:
            result.problems.append("stream ended without data: [DONE]")
            result.latency_s = time.monotonic() - result.start
        if result.finish_reason is None:
            result.problems.append("no finish_reason in the stream")
        result.ok = result.done and result.finish_reason is not None and not result.problems

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        result.status = "timeout" if result.status is None else result.status
        result.problems.append(f"no end within {timeout} s")
        result.ok = False
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as error:
        if result.status is None:
            result.status = f"conn:{type(error).__name__}"
        result.problems.append(f"{type(error).__name__}: {error}")
        result.ok = False
    finally:
        if writer is not None:
            writer.close()
    return result
