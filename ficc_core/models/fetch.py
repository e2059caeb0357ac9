"""Outbound HTTPS for acquisitions and hub previews: checked URLs, addresses and redirects.

Every URL, and every redirect target, must be ``https://``. Its host is resolved
once per connection, every address it resolves to must be public (not loopback,
private, link-local or otherwise non-public) unless the operator set
``allow_private_addresses``, and the connection goes to one of exactly those
addresses: the HTTP layer never resolves the name again, so a name that answers
a public address to the check and a private one to the connection (DNS
rebinding) reaches nothing it should not. Redirects are followed here, one hop
at a time and at most ``max_redirects`` of them, each on a new connection, so
each hop is resolved and checked. Names are resolved with
:func:`trio.socket.getaddrinfo`, so :func:`trio.socket.set_custom_hostname_resolver`
replaces the resolver (tests use it to answer differently from call to call).

The request itself runs in a worker thread on a blocking socket
(:mod:`ficc_core.http1.client`); cancelling a caller aborts the connection and
waits for the thread, so no thread outlives its request.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import outcome
import trio

from .._version import __version__
from ..config import Config
from ..http1.client import Address, FetchError, Http1Connection

__all__ = [
    "FetchError",
    "FetchPolicy",
    "Fetcher",
    "Response",
    "address_is_public",
    "make_client",
    "open_response",
]

T = TypeVar("T")

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Sent with every request unless the caller says otherwise: the bytes as stored
#: (a compressed body would not hash to the declared digest).
_DEFAULT_HEADERS = {
    "User-Agent": f"ficc/{__version__}",
    "Accept": "*/*",
    "Accept-Encoding": "identity",
}


def address_is_public(address: str) -> bool:
    """Whether ``address`` is a global unicast address (an IPv4-mapped one by its IPv4 form)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


@attrs.frozen
class FetchPolicy:
    """What outbound requests may do, from the controller's configuration."""

    allow_private: bool = False
    max_redirects: int = 5
    connect_timeout: float = 15.0
    read_timeout: float = 60.0
    ca_bundle: Path | None = None
    #: Which addresses count as public when ``allow_private`` is off. Not a setting:
    #: tests substitute their own to stand a loopback address in for a public one.
    is_public: Callable[[str], bool] = address_is_public

    @classmethod
    def from_config(cls, config: Config) -> FetchPolicy:
        """Take the policy from the controller's settings."""
        return cls(
            allow_private=config.allow_private_addresses,
            max_redirects=config.max_redirects,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            ca_bundle=config.ca_bundle,
        )


class Fetcher:
    """What outbound requests share: the TLS context, built once, in a worker thread.

    Use it as ``async with make_client(policy) as client``; it holds no connections.
    """

    def __init__(self, ca_bundle: Path | None) -> None:
        self._ca_bundle = ca_bundle
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def context(self) -> ssl.SSLContext:
        """The client TLS context (blocking the first time: it reads the CA bundle)."""
        with self._lock:
            if self._context is None:
                if self._ca_bundle is not None:
                    self._context = ssl.create_default_context(cafile=str(self._ca_bundle))
                else:
                    self._context = httpx.create_ssl_context(trust_env=False)  # certifi's CAs
            return self._context


def make_client(policy: FetchPolicy) -> Fetcher:
    """Return what :func:`open_response` needs to connect, trusting ``policy.ca_bundle``."""
    return Fetcher(policy.ca_bundle)


async def run_abortable(fn: Callable[[], T], abort: Callable[[], None]) -> T:
    """Run blocking ``fn()`` in a worker thread and return (or raise) what it does.

    If the caller is cancelled meanwhile, ``abort()`` is called, which must make
    ``fn`` return soon, and ``fn`` is still waited for: the thread never outlives
    the call. What ``fn`` returned is then returned (a caller can keep what it got
    before it was aborted) and the cancellation is raised at the caller's next
    checkpoint; what it raised (most likely because it was aborted) gives way to
    the cancellation.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    aborted = False

    def deliver(result: outcome.Outcome[T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(result))

    trio.lowlevel.start_thread_soon(fn, deliver, name="ficc fetch")

    def on_cancel(_raise_cancel: Any) -> trio.lowlevel.Abort:
        nonlocal aborted
        aborted = True
        abort()
        return trio.lowlevel.Abort.FAILED

    result: outcome.Outcome[T] = await trio.lowlevel.wait_task_rescheduled(on_cancel)
    if aborted and isinstance(result, outcome.Error):
        await trio.lowlevel.checkpoint()  # raises the cancellation
    return result.unwrap()


class Response:
    """A response whose head has been read; the body is read with :meth:`aiter_raw`
    or, in a worker thread, with :meth:`run_sync`."""

    def __init__(self, connection: Http1Connection, url: httpx.URL, head: Any) -> None:
        self.url = url
        self.status_code: int = head.status_code
        self.reason_phrase: str = head.reason.decode("latin-1")
        self.headers = httpx.Headers(head.headers)
        self._connection = connection

    async def aiter_raw(self, chunk: int = 64 * 1024) -> AsyncIterator[bytes]:
        """Yield the body in pieces of at most ``chunk`` bytes, each read in a worker thread."""
        while True:
            data = await self.run_sync(lambda connection: connection.read(chunk))
            if not data:
                return
            yield data

    async def run_sync(self, fn: Callable[[Http1Connection], T]) -> T:
        """Run ``fn(connection)`` in a worker thread; it reads the body with ``readinto``.

        Cancelling aborts the connection (``fn`` then sees ``FetchError`` ``aborted``)
        and still waits for ``fn``; see :func:`run_abortable`.
        """
        return await run_abortable(lambda: fn(self._connection), self._connection.abort)

    def abort(self) -> None:
        """Make a read in progress fail at once (from any thread)."""
        self._connection.abort()

    async def aclose(self) -> None:
        """Close the connection."""
        self._connection.close()


def _parse(url: str | httpx.URL) -> httpx.URL:
    try:
        parsed = httpx.URL(str(url))
    except (httpx.InvalidURL, ValueError) as exc:
        raise FetchError(
            f"{url!s} is not a valid URL: {exc}", code="invalid_url", status=400
        ) from None
    if parsed.scheme == "https" and not parsed.host:
        raise FetchError(f"{url!s} has no host", code="invalid_url", status=400)
    return parsed


async def _resolve(url: httpx.URL, policy: FetchPolicy, refusal: _Refusal) -> list[Address]:
    """Resolve ``url``'s host once; return its addresses, every one allowed by ``policy``."""
    host = url.raw_host.decode("ascii")
    try:
        infos = await trio.socket.getaddrinfo(host, url.port or 443, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchError(
            f"cannot resolve {host}: {exc}",
            code="unresolvable_host",
            details={"host": host},
        ) from None
    addresses: list[Address] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if (family, sockaddr) not in addresses:
            addresses.append((family, sockaddr))
    if not addresses:
        raise FetchError(f"{host} resolves to no address", code="unresolvable_host")
    if not policy.allow_private:
        blocked = sorted({str(a[1][0]) for a in addresses if not policy.is_public(str(a[1][0]))})
        if blocked:
            raise refusal.private(url, host, blocked)
    return addresses


@attrs.frozen
class _Refusal:
    """Words for refusing a hop: the registered URL and, for a redirect, where it came from."""

    requested: str
    came_from: httpx.URL | None = None

    def _context(self, url: httpx.URL) -> tuple[str, dict[str, Any]]:
        if self.came_from is None:
            return "", {"url": str(url)}
        details = {"url": str(url), "redirected_from": str(self.came_from)}
        via = ""
        if str(self.came_from) != self.requested:
            via = f" (via {self.came_from})"
            details["requested_url"] = self.requested
        return f"{self.requested} redirected{via} to {url}, which is refused: ", details

    def insecure(self, url: httpx.URL) -> FetchError:
        prefix, details = self._context(url)
        what = f"not {str(url)!r}" if not prefix else f"not {url.scheme}://"
        return FetchError(
            f"{prefix}only https:// URLs are fetched, {what}",
            code="insecure_url",
            status=400,
            details=details,
        )

    def private(self, url: httpx.URL, host: str, blocked: list[str]) -> FetchError:
        prefix, details = self._context(url)
        return FetchError(
            f"{prefix}{host} resolves to a non-public address ({', '.join(blocked)}); the "
            "operator must set allow_private_addresses to fetch from it",
            code="private_address",
            status=400,
            details={**details, "host": host, "addresses": blocked},
        )


async def _send(
    client: Fetcher,
    url: httpx.URL,
    policy: FetchPolicy,
    headers: Mapping[str, str],
    refusal: _Refusal,
) -> Response:
    if url.scheme != "https":
        raise refusal.insecure(url)
    addresses = await _resolve(url, policy, refusal)
    connection = Http1Connection(
        url.raw_host.decode("ascii"),
        connect_timeout=policy.connect_timeout,
        read_timeout=policy.read_timeout,
    )

    def exchange() -> Any:
        connection.connect(client.context(), url.port or 443, addresses)
        return connection.request(url.raw_path, url.netloc, list(headers.items()))

    try:
        head = await run_abortable(exchange, connection.abort)
    except BaseException:
        connection.close()
        raise
    return Response(connection, url, head)


@asynccontextmanager
async def open_response(
    client: Fetcher,
    url: str,
    policy: FetchPolicy,
    *,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[Response]:
    """GET ``url`` following at most ``policy.max_redirects`` checked redirects.

    Yield the final response with its body not yet read; it is closed on exit.
    """
    current = _parse(url)
    refusal = _Refusal(requested=str(current))
    seen: set[str] = set()
    for _hop in range(policy.max_redirects + 1):
        seen.add(str(current))
        response = await _send(
            client, current, policy, {**_DEFAULT_HEADERS, **(headers or {})}, refusal
        )
        if response.status_code not in _REDIRECTS:
            try:
                yield response
            finally:
                await response.aclose()
            return
        await response.aclose()
        location = response.headers.get("Location")
        if not location:
            raise FetchError(
                f"{current} answered {response.status_code} without a Location header",
                code="bad_redirect",
            )
        target = _parse(current.join(location))
        if str(target) in seen:
            raise FetchError(
                f"redirect loop at {target}", code="redirect_loop", details={"url": str(target)}
            )
        refusal = attrs.evolve(refusal, came_from=current)
        current = target
    raise FetchError(
        f"more than {policy.max_redirects} redirects from {url}",
        code="too_many_redirects",
        details={"url": url, "limit": policy.max_redirects},
    )
