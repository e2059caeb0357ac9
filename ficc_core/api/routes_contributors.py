"""Contributor nodes: state, last heartbeat, snapshot and attempts (scope ``contributors:read``),
their removal once lost (scope ``admin``), the WebSocket remote agents dial out to, and
the blob download route nodes stage model inputs from (both authenticated by a node
credential only; a node downloads only the inputs of attempts assigned to it, while
they are).

Nodes belong to the installation, not to a project: every project's readers see them.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from quart import Response, jsonify, request, websocket

from ..base.errors import FiccError, NotFound
from ..contributors.connection import serve_node_connection
from ..nodelink.wire import PROTOCOL_HEADER, PROTOCOL_VERSION, negotiate
from .access import route
from .views_contributors import node_view, removal_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


#: Bytes read off the event loop per chunk of a blob download.
BLOB_CHUNK = 1 << 20

_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANGE = re.compile(r"bytes=(\d+)-")


def _bearer_token(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise FiccError(
            "send 'Authorization: Bearer <node credential>'",
            code="unauthenticated",
            status=401,
        )
    return token.strip()


def _range_start(header: str | None, size: int) -> int | None:
    """The first byte a ``Range: bytes=N-`` header asks for; None without one.

    Only a single open-ended range is served (what a resuming download sends);
    a start at or past the end is 416.
    """
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise FiccError(
            "only 'Range: bytes=<start>-' is supported",
            code="range_not_satisfiable",
            status=416,
            headers={"Content-Range": f"bytes */{size}"},
        )
    start = int(match.group(1))
    if start >= size:
        raise FiccError(
            f"the range starts at byte {start}; the blob has {size} bytes",
            code="range_not_satisfiable",
            status=416,
            details={"size": size},
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start


async def _read_from(path: Path, start: int, length: int) -> AsyncIterator[bytes]:
    """Yield ``length`` bytes of ``path`` from ``start``, each chunk read in a worker thread."""
    handle = await trio.open_file(path, "rb")
    try:
        await handle.seek(start)
        remaining = length
        while remaining > 0:
            chunk = await handle.read(min(BLOB_CHUNK, remaining))
            if not chunk:
                return  # the file shrank under us: the client sees a short body
            remaining -= len(chunk)
            yield chunk
    finally:
        with trio.CancelScope(shield=True):
            await handle.aclose()


def register(app: QuartTrio, service: Service) -> None:
    """Add the contributor routes to ``app``."""

    @route(app, "contributors_list")
    async def contributors_list() -> Response:
        nodes = await service.contributors.list()
        return jsonify({"contributors": [node_view(node) for node in nodes]})

    @route(app, "contributors_get")
    async def contributors_get(node_id: str) -> Response:
        return jsonify(node_view(await service.contributors.get(node_id)))

    @route(app, "contributors_doctor")
    async def contributors_doctor(node_id: str) -> Response:
        from ..agent.doctor import Finding, skew_finding

        await service.contributors.get(node_id)  # 404 for an unknown node
        before = time.time()
        found, node_time = await service.contributors.doctor(node_id)
        after = time.time()
        findings = [Finding.from_json(item) for item in found]
        if node_time:
            # Positive: the controller is ahead (as ficc doctor on the node reports it).
            findings.append(skew_finding((before + after) / 2 - node_time))
        return jsonify(
            {
                "node": node_id,
                "findings": [f.to_json() for f in findings],
                "ok": all(f.status != "FAIL" for f in findings),
            }
        )

    @route(app, "contributors_remove")
    async def contributors_remove(node_id: str) -> Response:
        return jsonify(removal_view(await service.contributors.remove_node(node_id)))

    @route(app, "contributors_blob")
    async def contributors_blob(sha256: str) -> Response:
        # A node credential only (checked here, like the WebSocket): a node stages the
        # inputs of the attempts assigned to it, by digest, resuming with Range.
        node_id = await service.contributors.authenticate(
            _bearer_token(request.headers.get("Authorization", ""))
        )
        # One answer for unknown, unverified and not-assigned-to-you digests: a
        # refusal tells a node nothing about other nodes' or projects' files.
        unknown = NotFound(
            f"no blob {sha256} is an input of an attempt assigned to this node",
            code="blob_unknown",
        )
        if _SHA256.fullmatch(sha256) is None:
            raise unknown
        if not await service.contributors.may_download(node_id, sha256):
            raise unknown
        path = service.blobs.published_path(sha256)
        try:
            size = (await trio.Path(path).stat()).st_size
        except FileNotFoundError:
            raise unknown from None
        start = _range_start(request.headers.get("Range"), size)
        headers = {
            "Accept-Ranges": "bytes",
            "Content-Length": str(size - (start or 0)),
            "ETag": f'"{sha256}"',
        }
        if start is not None:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        response = Response(
            _read_from(path, start or 0, size - (start or 0)),
            status=206 if start is not None else 200,
            headers=headers,
            mimetype="application/octet-stream",
        )
        response.timeout = None  # a multi-GiB blob takes as long as it takes
        return response

    @route(app, "contributors_connect")
    async def contributors_connect() -> Response | None:
        # Authenticated here, by the node credential alone: the node ID comes from
        # the credential, never from what the agent says.
        from .app import error_response

        scheme, _, token = websocket.headers.get("Authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise FiccError(
                    "connect with 'Authorization: Bearer <node credential>'",
                    code="unauthenticated",
                    status=401,
                )
            node_id = await service.contributors.authenticate(token.strip())
            # An agent more than a minor version apart is refused before it is
            # registered (426, naming what to upgrade); none sent is 1.0.
            agent_version = websocket.headers.get(PROTOCOL_HEADER)
            negotiate(agent_version, PROTOCOL_VERSION, refusing="controller")
        except FiccError as exc:
            return error_response(exc)
        await websocket.accept()
        # The object itself, not the context-local proxy: other tasks (commands
        # sent by the controller) use it outside this handler's context.
        channel = websocket._get_current_object()  # type: ignore[attr-defined]
        await serve_node_connection(
            service.contributors,
            node_id,
            channel,
            heartbeat_interval=service.config.heartbeat_interval,
            lease_duration=service.config.lease_duration,
            agent_version=agent_version,
        )
        return None
