"""The gateway benchmark's load generator: a lean asyncio HTTP/1.1 client, one job per run.

Run by ``gateway_bench.py`` as its own process (pinned to core 0)::

    python bench/loadgen.py '{"job": "load", ...}'

It prints one JSON object with the job's raw measurements. Standard library only:
a protocol-level HTTP/1.1 client (keep-alive, Content-Length and chunked bodies,
server-sent events counted as they arrive) costs a few tens of microseconds of CPU
per request, so the generator is not what limits a target (the direct-to-engine
figures are the ceiling it reaches). Every loop is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import sys
import time
from typing import Any

_TOKEN = re.compile(rb"tok(\d+) ")
_CONTENT = re.compile(rb'"content":\s*"((?:[^"\\]|\\.)+)"')


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (children not included)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_ticks(pid) for pid in pids) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as handle:
        for line in handle:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Target:
    """Where requests go: ``tcp:HOST:PORT`` or ``unix:/path``, a path prefix and a token."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.address = spec["address"]
        self.prefix = spec.get("prefix", "")
        self.auth = spec.get("auth")
        self.model = spec.get("model", "standin")
        self.extra = spec.get("extra", {})
        #: More request headers, as "Name: value" lines (a session header, say).
        self.headers = list(spec.get("headers", ()))

    def request(self, path: str, body: dict[str, Any] | None) -> bytes:
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        method = "GET" if body is None else "POST"
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", "Host: bench"]
        if self.auth:
            lines.append(f"Authorization: Bearer {self.auth}")
        lines += self.headers
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload

    def chat(self, content: str, *, stream: bool = False, **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            **self.extra,
            **extra,
        }
        if stream:
            body["stream"] = True
        return self.request("/v1/chat/completions", body)

    async def connect(self, rcvbuf: int | None = None) -> tuple[Any, Client]:
        loop = asyncio.get_running_loop()
        kind, _, rest = self.address.partition(":")
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = rest
        else:
            host, _, port = rest.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = (host, int(port))
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, target)
        if rcvbuf:
            return sock, None  # type: ignore[return-value]
        transport, protocol = await loop.create_connection(Client, sock=sock)
        return transport, protocol


class Response:
    def __init__(self) -> None:
        self.status = 0
        self.sent = 0.0
        self.head_at = 0.0
        self.done_at = 0.0
        self.body = bytearray()
        self.events = 0  # complete SSE events
        self.deltas: list[float] = []  # arrival time of each content delta
        self.tokens: list[int] = []  # the stand-in's delta numbers, in arrival order
        self.close = False
        self.error: str | None = None


class Client(asyncio.Protocol):
    """One keep-alive connection: send a request, parse its response incrementally."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.response: Response | None = None
        self.waiter: asyncio.Future[Response] | None = None
        self.on_delta: Any = None
        self.lost = False
        self._state = "idle"
        self._length = 0
        self._chunked = False
        self._sse = bytearray()
        self._stream = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            assert self.response is not None
            self.response.error = "connection lost"
            self.waiter.set_result(self.response)

    def send(self, request: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self.response = Response()
        self.response.sent = time.perf_counter()
        self.waiter = asyncio.get_running_loop().create_future()
        self._state = "head"
        self._sse.clear()
        self.transport.write(request)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._advance()

    def _advance(self) -> None:
        response = self.response
        while response is not None and self._state != "idle":
            if self._state == "head":
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = bytes(self.buffer[:end]).split(b"\r\n")
                del self.buffer[: end + 4]
                response.status = int(lines[0].split(b" ", 2)[1])
                response.head_at = time.perf_counter()
                self._chunked, self._length, self._stream = False, 0, False
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    value = value.strip().lower()
                    if name == b"content-length":
                        self._length = int(value)
                    elif name == b"transfer-encoding" and b"chunked" in value:
                        self._chunked = True
                    elif name == b"content-type" and value.startswith(b"text/event-stream"):
                        self._stream = True
                    elif name == b"connection" and value == b"close":
                        response.close = True
                self._state = "chunk-size" if self._chunked else "body"
            elif self._state == "body":
                take = min(self._length, len(self.buffer))
                if take:
                    self._body(bytes(self.buffer[:take]))
                    del self.buffer[:take]
                    self._length -= take
                if self._length:
                    return
                self._complete()
            elif self._state == "chunk-size":
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return
                self._length = int(bytes(self.buffer[:end]).split(b";")[0], 16)
                del self.buffer[: end + 2]
                self._state = "chunk" if self._length else "trailer"
            elif self._state == "chunk":
                take = min(self._length, len(self.buffer))
                if take:
                    self._body(bytes(self.buffer[:take]))
                    del self.buffer[:take]
                    self._length -= take
                if self._length:
                    return
                if len(self.buffer) < 2:
                    self._state = "chunk-crlf"
                    return
                del self.buffer[:2]
                self._state = "chunk-size"
            elif self._state == "chunk-crlf":
                if len(self.buffer) < 2:
                    return
                del self.buffer[:2]
                self._state = "chunk-size"
            elif self._state == "trailer":
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return
                del self.buffer[: end + 2]
                if end == 0:
                    self._complete()

    def _body(self, data: bytes) -> None:
        response = self.response
        assert response is not None
        if not self._stream:
            response.body += data
            return
        self._sse += data
        at = self._sse.rfind(b"\n\n")
        if at < 0:
            return
        complete = bytes(self._sse[: at + 2])
        del self._sse[: at + 2]
        now = time.perf_counter()
        events = complete.count(b"\n\n")
        response.events += events
        numbers = _TOKEN.findall(complete)
        if numbers:
            response.tokens.extend(int(n) for n in numbers)
            response.deltas.extend([now] * len(numbers))
        else:
            found = len(_CONTENT.findall(complete))
            response.deltas.extend([now] * found)
        if self.on_delta is not None and numbers:
            self.on_delta(response)
        if len(response.body) < 4096:
            response.body += complete[:4096]

    def _complete(self) -> None:
        response = self.response
        assert response is not None and self.waiter is not None
        response.done_at = time.perf_counter()
        self._state = "idle"
        if not self.waiter.done():
            self.waiter.set_result(response)


class Pool:
    """Connections to one target, opened on demand and reused (keep-alive)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.idle: list[Client] = []

    async def call(self, request: bytes, timeout: float = 30.0) -> Response:  # noqa: ASYNC109
        client = self.idle.pop() if self.idle else None
        if client is None or client.lost:
            _, client = await self.target.connect()
        try:
            response = await asyncio.wait_for(client.send(request), timeout)
            if response.error and not response.status and client is not None:
                # A kept-alive connection the server had closed: once more on a new one.
                _, client = await self.target.connect()
                response = await asyncio.wait_for(client.send(request), timeout)
        except TimeoutError:
            assert client.transport is not None
            client.transport.close()
            response = client.response or Response()
            response.error = "timeout"
            return response
        if response.error is None and not response.close and not client.lost:
            self.idle.append(client)
        elif client.transport is not None:
            client.transport.close()
        return response

    def close(self) -> None:
        for client in self.idle:
            if client.transport is not None:
                client.transport.close()
        self.idle.clear()


def _ok(response: Response) -> bool:
    return response.error is None and 200 <= response.status < 300


def _padded(size: int) -> str:
    """A message content that makes the request body about ``size`` bytes."""
    return "x" * max(0, size - 160)


# -- jobs -------------------------------------------------------------------------------------


async def job_pairs(spec: dict[str, Any]) -> dict[str, Any]:
    """Interleaved pairs at concurrency 1: direct then target, order alternating."""
    direct, target = Pool(Target(spec["direct"])), Pool(Target(spec["target"]))
    size = spec.get("body_bytes", 1024)
    requests = (
        direct.target.chat(_padded(size)),
        target.target.chat(_padded(size)),
    )
    for _ in range(spec.get("warmup", 20)):
        await direct.call(requests[0])
        await target.call(requests[1])
    base, through, errors = [], [], 0
    limit = time.perf_counter() + spec["seconds"]
    for i in range(spec["pairs"]):
        if time.perf_counter() > limit:
            break
        order = (0, 1) if i % 2 == 0 else (1, 0)
        got = [0.0, 0.0]
        for which in order:
            pool = (direct, target)[which]
            response = await pool.call(requests[which])
            if not _ok(response):
                errors += 1
            got[which] = response.done_at - response.sent
        base.append(got[0])
        through.append(got[1])
    direct.close()
    target.close()
    return {"direct": base, "target": through, "errors": errors}


async def job_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Closed loop at ``concurrency`` for ``seconds`` after ``warmup``; CPU of ``pids``."""
    pool = Pool(Target(spec["target"]))
    request = pool.target.chat(_padded(spec.get("body_bytes", 1024)))
    concurrency, pids = spec["concurrency"], spec.get("pids", [])
    state = {"measuring": False, "stop": False}
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0}

    async def worker() -> None:
        while not state["stop"]:
            response = await pool.call(request, timeout=10)
            if state["measuring"]:
                if _ok(response):
                    counts["ok"] += 1
                    latencies.append(response.done_at - response.sent)
                else:
                    counts["errors"] += 1
            if not _ok(response) and response.error:
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(spec.get("warmup", 0.5))
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(spec["seconds"])
    state["measuring"] = False
    cpu1, t1 = cpu_seconds(pids), time.perf_counter()
    state["stop"] = True
    _done, pending = await asyncio.wait(tasks, timeout=15)
    for task in pending:
        task.cancel()
    pool.close()
    latencies.sort()
    return {
        "concurrency": concurrency,
        "ok": counts["ok"],
        "errors": counts["errors"],
        "elapsed": t1 - t0,
        "cpu": cpu1 - cpu0,
        "latencies": _summary(latencies),
    }


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": pick(0.5), "p99": pick(0.99), "max": values[-1]}


async def job_streams(spec: dict[str, Any]) -> dict[str, Any]:
    """``concurrency`` simultaneous streams of ``n`` deltas ``gap`` apart, ``rounds`` times."""
    target = Target(spec["target"])
    n, gap = spec["n"], spec["gap"]
    request = target.chat(f"stream n={n} gap={gap}", stream=True)
    concurrency, pids = spec["concurrency"], spec.get("pids", [])
    pools = [Pool(target) for _ in range(concurrency)]
    timeout = spec.get("timeout", 60.0)
    # Open the connections first, so the measured streams start together.
    for pool in pools:
        _, client = await target.connect()
        pool.idle.append(client)
    ttfb, gaps, durations, spreads = [], [], [], []
    lost = errors = deltas = 0
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    limit = t0 + spec.get("seconds", 120)
    for _ in range(spec.get("rounds", 1)):
        if time.perf_counter() > limit:
            break
        results = await asyncio.gather(*(p.call(request, timeout=timeout) for p in pools))
        for response in results:
            if not _ok(response):
                errors += 1
            lost += max(0, n - len(set(response.tokens)))
            deltas += len(response.deltas)
            if response.deltas:
                ttfb.append(response.deltas[0] - response.sent)
                durations.append(response.deltas[-1] - response.sent)
                spreads.append(response.deltas[-1] - response.deltas[0])
                arrivals = response.deltas
                gaps.extend(b - a for a, b in itertools.pairwise(arrivals))
    cpu1, t1 = cpu_seconds(pids), time.perf_counter()
    for pool in pools:
        pool.close()
    return {
        "concurrency": concurrency,
        "n": n,
        "gap": gap,
        "errors": errors,
        "lost": lost,
        "deltas": deltas,
        "elapsed": t1 - t0,
        "cpu": cpu1 - cpu0,
        "ttfb": _summary(ttfb),
        "gaps": _summary(gaps),
        "duration": _summary(durations),
        "spread": _summary(spreads),
    }


async def job_ttfb_pairs(spec: dict[str, Any]) -> dict[str, Any]:
    """Interleaved pairs of short unpaced streams: time to the first delta, direct vs target."""
    direct, target = Pool(Target(spec["direct"])), Pool(Target(spec["target"]))
    n = spec.get("n", 8)
    requests = [p.target.chat(f"stream n={n} gap=0", stream=True) for p in (direct, target)]
    base, through, errors = [], [], 0
    limit = time.perf_counter() + spec["seconds"]
    for i in range(spec["pairs"] + 10):
        if time.perf_counter() > limit:
            break
        got = [0.0, 0.0]
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            response = await (direct, target)[which].call(requests[which])
            if not _ok(response) or not response.deltas:
                errors += 1
                got[which] = float("nan")
            else:
                got[which] = response.deltas[0] - response.sent
        if i >= 10:  # the first ten are warm-up
            base.append(got[0])
            through.append(got[1])
    direct.close()
    target.close()
    return {"direct": base, "target": through, "errors": errors}


async def _stats(address: str) -> dict[str, Any]:
    pool = Pool(Target({"address": address}))
    response = await pool.call(Target({"address": address}).request("/stats", None), timeout=5)
    pool.close()
    return json.loads(bytes(response.body))


async def job_abort(spec: dict[str, Any]) -> dict[str, Any]:
    """Close a paced stream after 3 deltas; how long until the engine sees the disconnect."""
    target = Target(spec["target"])
    request = target.chat("stream n=2000 gap=0.02", stream=True)
    delays: list[float | None] = []
    limit = time.perf_counter() + spec.get("seconds", 60)
    for _ in range(spec["repeats"]):
        if time.perf_counter() > limit:
            break
        _, client = await target.connect()
        seen = asyncio.get_running_loop().create_future()

        def on_delta(response: Response, seen: asyncio.Future[None] = seen) -> None:
            if len(response.tokens) >= 3 and not seen.done():
                seen.set_result(None)

        client.on_delta = on_delta
        client.send(request)
        try:
            await asyncio.wait_for(seen, 10)
        except TimeoutError:
            delays.append(None)
            client.transport.close()  # type: ignore[union-attr]
            continue
        before = (await _stats(spec["engine"]))["disconnects"]
        aborted = time.monotonic()
        assert client.transport is not None
        client.transport.abort()
        found = None
        deadline = time.perf_counter() + spec.get("wait", 3.0)
        while time.perf_counter() < deadline:
            stats = await _stats(spec["engine"])
            if stats["disconnects"] > before:
                found = stats["last_disconnect"] - aborted
                break
            await asyncio.sleep(0.001)
        delays.append(found)
        await asyncio.sleep(0.05)
    return {"delays": delays}


async def job_slow(spec: dict[str, Any]) -> dict[str, Any]:
    """``clients`` streams read 1 KiB every ``pause`` s through tiny receive buffers; peak RSS."""
    target = Target(spec["target"])
    request = target.chat(f"stream n={spec['n']} gap=0", stream=True)
    pids = spec["pids"]
    loop = asyncio.get_running_loop()
    baseline = sum(rss_bytes(pid) for pid in pids)
    received = [0]
    stop = asyncio.Event()

    async def reader() -> None:
        sock, _ = await target.connect(rcvbuf=4096)
        try:
            await loop.sock_sendall(sock, request)
            while not stop.is_set():
                data = await loop.sock_recv(sock, 1024)
                if not data:
                    return
                received[0] += len(data)
                await asyncio.sleep(spec["pause"])
        finally:
            sock.close()

    tasks = [asyncio.create_task(reader()) for _ in range(spec["clients"])]
    peak = baseline
    end = time.perf_counter() + spec["seconds"]
    while time.perf_counter() < end:
        await asyncio.sleep(0.1)
        peak = max(peak, sum(rss_bytes(pid) for pid in pids))
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.5)
    after = sum(rss_bytes(pid) for pid in pids)
    return {"baseline": baseline, "peak": peak, "after": after, "received": received[0]}


async def job_tokens(spec: dict[str, Any]) -> dict[str, Any]:
    """Streamed completions from a real engine: completion deltas and seconds, each request."""
    target = Target(spec["target"])
    pool = Pool(target)
    request = target.chat(
        spec.get("prompt", "Write a long story about a lighthouse keeper."),
        stream=True,
        max_tokens=spec["max_tokens"],
        temperature=0,
        seed=1,
    )
    out = []
    for _ in range(spec.get("repeats", 1)):
        response = await pool.call(request, timeout=spec.get("timeout", 120))
        if not _ok(response) or not response.deltas:
            out.append({"error": response.error or response.status})
            continue
        out.append(
            {
                "deltas": len(response.deltas),
                "seconds": response.deltas[-1] - response.sent,
                "ttft": response.deltas[0] - response.sent,
            }
        )
    pool.close()
    return {"requests": out}


JOBS = {
    "pairs": job_pairs,
    "load": job_load,
    "streams": job_streams,
    "ttfb_pairs": job_ttfb_pairs,
    "abort": job_abort,
    "slow": job_slow,
    "tokens": job_tokens,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = asyncio.run(JOBS[spec["job"]](spec))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
