"""What the API-talking commands (``ficc models``, ``ficc inference``, ``ficc whoami``) share.

A small synchronous client that turns the API's error envelope into a
:class:`click.ClickException` (message and code, non-zero exit), built for the
invocation's controller and credential (:func:`~.options.connection`: ``--url``,
``--token``, their environment variables, the stored login).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import click
import httpx

from .options import connection

__all__ = ["ApiClient", "ApiError", "client_from"]


class ApiClient:
    """A small synchronous client of the management API that turns envelopes into errors."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 120.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """A client of ``url`` with bearer ``token`` (or, when given, only ``headers``)."""
        if not token and headers is None:
            raise click.UsageError(
                f"no credential for {url}: run 'ficc login {url}', or give --token or set "
                "FICC_TOKEN (a bearer credential)"
            )
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers={**auth, **(headers or {})}, timeout=timeout
        )

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; raise a ClickException with the server's message on refusal."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach {self.http.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise ApiError(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request and return its JSON body."""
        return self.call(method, path, **kwargs).json()

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """Send a request and yield its response unread; a refusal raises :class:`ApiError`."""
        try:
            with self.http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(response)
                yield response
        except httpx.HTTPError as exc:
            raise click.ClickException(f"cannot reach {self.http.base_url}: {exc}") from None


class ApiError(click.ClickException):
    """A refusal from the API, carrying its envelope."""

    def __init__(self, response: httpx.Response) -> None:
        try:
            self.error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            self.error = {"code": "http_error", "message": response.text[:200], "details": {}}
        self.status = response.status_code
        self.response = response
        super().__init__(f"{self.error['message']} [{self.error['code']}]")

    @property
    def code(self) -> str:
        """The envelope's stable error code."""
        return self.error["code"]

    @property
    def details(self) -> dict[str, Any]:
        """The envelope's details (an empty dict when it has none)."""
        return self.error.get("details") or {}


def client_from(ctx: click.Context) -> ApiClient:
    """The client for this invocation's controller and credential."""
    found = connection(ctx)
    return ApiClient(found.url, found.token)
