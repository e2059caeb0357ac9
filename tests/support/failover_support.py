"""A controller's end of the node wire on loopback, with no controller behind it.

:class:`WirePeer` serves ``/api/v1/contributors/connect`` with trio-websocket on an
OS-chosen port and speaks the real protocol through the controller's own
:class:`~ficc_core.nodelink.links.ConnectionLink` (commands matched to replies,
relayed endpoint streams): a welcome with a role and a term, renewals and commands
stamped with whatever term the test says. It stands in for one controller of
several so the node's side (fencing by term, one link per controller) is tested
against real agents and real sockets without a leader lease.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from ficc_core.nodelink.links import ConnectionLink
from ficc_core.schema import Fence, unstructure

CREDENTIAL = "ficcnode_wire_peer_test"


class _Channel:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, data: str | bytes) -> None:
        await self.ws.send_message(data)

    async def receive(self) -> str | bytes:
        return await self.ws.get_message()


class WirePeer:
    """One stand-in controller: welcomes node ``node_id`` as ``role`` of ``term``.

    :param renew_every: seconds between renewals of :attr:`term` (None: the test renews).
    """

    def __init__(
        self,
        *,
        node_id: str = "gpu-1",
        role: str | None = "leader",
        term: int = 1,
        heartbeat_interval: float = 0.1,
        lease_duration: float = 30.0,
        renew_every: float | None = None,
    ) -> None:
        self.node_id = node_id
        self.role = role
        self.term = term
        self.heartbeat_interval = heartbeat_interval
        self.lease_duration = lease_duration
        self.renew_every = renew_every
        #: The base URL agents dial (set once :meth:`run` started).
        self.url = ""
        #: The link of the connection now open (None between connections).
        self.link: ConnectionLink | None = None
        #: Heartbeats received, all connections together.
        self.heartbeats = 0
        #: Connections welcomed.
        self.sessions = 0
        self._scope = trio.CancelScope()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[WirePeer] = trio.TASK_STATUS_IGNORED):
        """Serve until cancelled or :meth:`go_away`; reports itself once it listens."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                server = await nursery.start(
                    lambda task_status: serve_websocket(
                        self._serve, "127.0.0.1", 0, None, task_status=task_status
                    )
                )
                self.url = f"http://127.0.0.1:{server.port}"
                task_status.started(self)

    def go_away(self) -> None:
        """Stop listening and drop the connection, as a controller process that died."""
        self._scope.cancel()

    async def _serve(self, request: WebSocketRequest) -> None:
        if request.path != "/api/v1/contributors/connect":
            await request.reject(404)
            return
        if dict(request.headers).get(b"authorization") != f"Bearer {CREDENTIAL}".encode():
            await request.reject(401, body=b'{"error": {"message": "unknown credential"}}')
            return
        ws = await request.accept()
        link = ConnectionLink(_Channel(ws), node=self.node_id)
        welcome: dict[str, Any] = {
            "type": "welcome",
            "node_id": self.node_id,
            "connection_id": secrets.token_hex(4),
            "heartbeat_interval": self.heartbeat_interval,
            "lease_duration": self.lease_duration,
        }
        if self.role is not None:
            welcome.update(role=self.role, term=self.term)
        try:
            await ws.send_message(json.dumps(welcome))
            async with trio.open_nursery() as nursery:
                await nursery.start(link.endpoint.run)
                if self.renew_every is not None:
                    nursery.start_soon(self._renew_forever)
                self.link = link
                self.sessions += 1
                self._wake()
                await self._receive(ws, link)
                nursery.cancel_scope.cancel()
        except ConnectionClosed:
            pass
        finally:
            link.close()
            if self.link is link:
                self.link = None
            self._wake()

    async def _receive(self, ws: Any, link: ConnectionLink) -> None:
        while True:
            try:
                raw = await ws.get_message()
            except ConnectionClosed:
                return
            if isinstance(raw, bytes):
                link.endpoint.deliver_binary(raw)
                continue
            message = json.loads(raw)
            kind = message.get("type")
            if kind == "reply":
                link.deliver(message)
            elif kind == "relay":
                link.endpoint.deliver(message)
            elif kind == "heartbeat":
                self.heartbeats += 1
                self._wake()

    async def _renew_forever(self) -> None:
        try:
            while True:
                await self.renew(term=self.term)
                await trio.sleep(self.renew_every)
        except ConnectionClosed:
            pass

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- what a test does ------------------------------------------------------------------

    async def connected(self) -> ConnectionLink:
        """Wait until an agent is connected; return its link."""
        while self.link is None:
            await self._changed.wait()
        return self.link

    async def wait_heartbeats(self, count: int) -> None:
        """Wait until ``count`` more heartbeats arrived."""
        target = self.heartbeats + count
        while self.heartbeats < target:
            await self._changed.wait()

    async def command(self, op: str, fence: Fence, *, term: int, **fields: Any) -> dict[str, Any]:
        """Send one command stamped with ``term``; return its reply or raise its refusal."""
        link = await self.connected()
        return await link.call({"op": op, "fence": unstructure(fence), "term": term, **fields})

    async def launch(self, job: Any, fence: Fence, *, term: int) -> dict[str, Any]:
        """Launch ``job`` as ``fence`` on the node's process provider, stamped ``term``."""
        return await self.command(
            "launch", fence, term=term, provider="process", job=unstructure(job)
        )

    async def renew(self, *, term: int | None, duration: float | None = None) -> None:
        """Send one renewal (``term`` None: a renewal with no term, as before terms)."""
        link = await self.connected()
        message: dict[str, Any] = {"type": "renew", "duration": duration or self.lease_duration}
        if term is not None:
            message["term"] = term
        await link.channel.send(json.dumps(message))
