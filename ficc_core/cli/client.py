"""What the API-talking command groups (``ficc models``, ``ficc inference``) share.

A small synchronous client that turns the API's error envelope into a
:class:`click.ClickException` (message and code, non-zero exit), the ``--url`` and
``--token`` options every such group takes, and plain-text output helpers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click
import httpx


class ApiClient:
    """A small synchronous client of the management API that turns envelopes into errors."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 120.0) -> None:
        if not token:
            raise click.UsageError("give --token or set FICC_TOKEN (a bearer credential)")
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
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


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--url`` (``FICC_URL``) and ``--token`` (``FICC_TOKEN``) to a command group."""
    command = click.option(
        "--token", envvar="FICC_TOKEN", help="Bearer credential. [env: FICC_TOKEN]"
    )(command)
    return click.option(
        "--url",
        envvar="FICC_URL",
        default="http://127.0.0.1:8484",
        show_default=True,
        help="Base URL of the controller. [env: FICC_URL]",
    )(command)


def client_from(ctx: click.Context) -> ApiClient:
    """The client for the group's ``--url`` and ``--token`` (kept in ``ctx.obj``)."""
    return ApiClient(ctx.obj["url"], ctx.obj["token"])


def echo_json(document: Any) -> None:
    """Print ``document`` as indented, key-sorted JSON."""
    click.echo(json.dumps(document, indent=2, sort_keys=True))


def echo_table(rows: Sequence[Sequence[Any]], *, err: bool = False) -> None:
    """Print ``rows`` (the first is the header) as left-aligned columns."""
    if not rows:
        return
    texts = [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in texts) for i in range(len(texts[0]))]
    for row in texts:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            err=err,
        )
