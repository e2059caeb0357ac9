"""Outbound HTTPS for acquisitions and hub previews: checked URLs, checked redirects.

Every URL, and every redirect target, must be ``https://`` and must not resolve
to a loopback, private, link-local or otherwise non-public address unless the
operator set ``allow_private_addresses``. Redirects are followed here, one hop at
a time and at most ``max_redirects`` of them, so each hop is checked.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from ..config import Config
from ..errors import FiccError


class FetchError(FiccError):
    """An outbound request was refused or failed; ``code`` says which way."""

    status = 502
    code = "fetch_failed"


@attrs.frozen
class FetchPolicy:
    """What outbound requests may do, from the controller's configuration."""

    allow_private: bool = False
    max_redirects: int = 5
    connect_timeout: float = 15.0
    read_timeout: float = 60.0
    ca_bundle: Path | None = None

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


def _address_is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def check_url(url: str | httpx.URL, policy: FetchPolicy) -> httpx.URL:
    """Return ``url`` parsed, or raise :class:`FetchError` if policy forbids it."""
    try:
        parsed = httpx.URL(str(url))
    except (httpx.InvalidURL, ValueError) as exc:
        raise FetchError(
            f"{url!s} is not a valid URL: {exc}", code="invalid_url", status=400
        ) from None
    if parsed.scheme != "https":
        raise FetchError(
            f"only https:// URLs are fetched, not {str(url)!r}",
            code="insecure_url",
            status=400,
            details={"url": str(url)},
        )
    if not parsed.host:
        raise FetchError(f"{url!s} has no host", code="invalid_url", status=400)
    if policy.allow_private:
        return parsed
    try:
        infos = await trio.socket.getaddrinfo(
            parsed.host, parsed.port or 443, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise FetchError(
            f"cannot resolve {parsed.host}: {exc}",
            code="unresolvable_host",
            details={"host": parsed.host},
        ) from None
    blocked = sorted({info[4][0] for info in infos if not _address_is_public(info[4][0])})
    if blocked:
        raise FetchError(
            f"{parsed.host} resolves to a non-public address ({', '.join(blocked)}); the operator "
            "must set allow_private_addresses to fetch from it",
            code="private_address",
            status=400,
            details={"host": parsed.host, "addresses": blocked},
        )
    return parsed


def make_client(policy: FetchPolicy) -> httpx.AsyncClient:
    """Return an HTTPS client that verifies certificates and never follows redirects itself."""
    verify: ssl.SSLContext | bool = True
    if policy.ca_bundle is not None:
        verify = ssl.create_default_context(cafile=str(policy.ca_bundle))
    return httpx.AsyncClient(
        verify=verify,
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(
            connect=policy.connect_timeout,
            read=policy.read_timeout,
            write=policy.read_timeout,
            pool=policy.connect_timeout,
        ),
    )


@asynccontextmanager
async def open_response(
    client: httpx.AsyncClient,
    url: str,
    policy: FetchPolicy,
    *,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[httpx.Response]:
    """GET ``url`` following at most ``policy.max_redirects`` checked redirects.

    Yield the final response with its body not yet read; it is closed on exit.
    """
    current = await check_url(url, policy)
    seen: set[str] = set()
    for _hop in range(policy.max_redirects + 1):
        seen.add(str(current))
        request = client.build_request("GET", current, headers=dict(headers or {}))
        try:
            response = await client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise FetchError(
                f"{current.host} did not answer in time ({type(exc).__name__})",
                code="fetch_timeout",
            ) from None
        except httpx.HTTPError as exc:
            raise FetchError(f"fetching {current} failed: {exc}", code="fetch_failed") from None
        if not response.is_redirect:
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
        target = current.join(location)
        if str(target) in seen:
            raise FetchError(
                f"redirect loop at {target}", code="redirect_loop", details={"url": str(target)}
            )
        current = await check_url(target, policy)
    raise FetchError(
        f"more than {policy.max_redirects} redirects from {url}",
        code="too_many_redirects",
        details={"url": url, "limit": policy.max_redirects},
    )
