"""The remote agent's transport: dial out to the controller over a WebSocket, stay connected.

The agent connects (so it works behind NAT), over TLS when the controller URL is
https, authenticated by its node credential. The controller names the node in
its welcome; the agent then heartbeats its snapshot and attempts every
``heartbeat_interval`` seconds from one task and applies lease renewals as they
arrive in another, so neither waits on the other; relayed endpoint streams
(:mod:`~ficc_core.nodelink.relay_node`) run in tasks of their own. A dropped connection is
retried with exponential backoff (0.5 s doubling to 30 s, with jitter); a refused
credential, or being fenced out by a newer connection of the same node, ends it.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

from ..errors import FiccError
from ..nodelink.commands import run_command
from ..nodelink.relay_node import RelayServer
from ..nodelink.wire import decode
from ..schema import unstructure
from .agent import Agent

log = logging.getLogger("ficc.agent")

CONNECT_PATH = "/api/v1/contributors/connect"
_TRANSIENT = (
    OSError,
    HandshakeError,
    ConnectionClosed,
    trio.BrokenResourceError,
    ValueError,
    KeyError,
)


class AgentRefused(FiccError):
    """The controller will not take this agent: bad credential, fenced out, wrong node."""

    status = 403
    code = "agent_refused"


def websocket_url(controller: str) -> str:
    """The WebSocket URL of a controller: ws:// for http, wss:// (TLS) for https."""
    parts = urlsplit(controller)
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.netloc:
        raise AgentRefused(
            f"{controller!r} is not a controller URL; give http(s)://host:port",
            code="bad_controller_url",
        )
    return urlunsplit((schemes[parts.scheme], parts.netloc, CONNECT_PATH, "", ""))


class RemoteAgent:
    """Keep one agent connected to its controller.

    :param controller: the controller's base URL (``https://ficc.example:8484``).
    :param credential: the node credential from ``ficc admin add-node``.
    :param make_agent: builds the :class:`Agent` once the controller has named the node.
    :param ssl_context: trust for https controllers (default: the system's).
    """

    def __init__(
        self,
        controller: str,
        credential: str,
        make_agent: Callable[[str], Agent],
        *,
        ssl_context: ssl.SSLContext | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        on_connected: Callable[[str], None] | None = None,
    ) -> None:
        self.url = websocket_url(controller)
        self.credential = credential
        self.make_agent = make_agent
        self.ssl_context = ssl_context
        if self.url.startswith("wss:") and ssl_context is None:
            self.ssl_context = ssl.create_default_context()
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_connected = on_connected
        self.agent: Agent | None = None
        #: How many sessions the controller welcomed (reconnects show here).
        self.sessions = 0
        #: The current session's relayed endpoint streams (None before the first).
        self.relay: RelayServer | None = None

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, and reconnect with backoff, until cancelled or refused.

        Reports the agent as started after the first welcome. Raises
        :class:`AgentRefused` when the controller refuses the credential or a
        newer connection of this node fences this one out.
        """
        refused: AgentRefused | None = None
        async with trio.open_nursery() as nursery:
            refused = await self._keep_connected(nursery, task_status)
            nursery.cancel_scope.cancel()
        # Raised outside the nursery, so callers catch it as itself, not in a group.
        if refused is not None:
            raise refused

    async def _keep_connected(
        self, nursery: trio.Nursery, task_status: trio.TaskStatus[Agent]
    ) -> AgentRefused:
        delay = self.backoff_initial
        while True:
            try:
                welcomed = await self._session(nursery, task_status)
            except AgentRefused as exc:
                return exc
            except _TRANSIENT as exc:
                welcomed = False
                log.warning("controller %s unreachable: %r", self.url, exc)
            except BaseExceptionGroup as group:
                refused, rest = group.split(AgentRefused)
                if refused is not None:
                    return _first(refused)
                _, unexpected = rest.split(_TRANSIENT)
                if unexpected is not None:
                    raise
                welcomed = False
                log.warning("controller %s unreachable: %r", self.url, group)
            if welcomed:
                delay = self.backoff_initial
            await trio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.backoff_max)

    async def _session(self, nursery: trio.Nursery, task_status: trio.TaskStatus[Agent]) -> bool:
        """One connection: return whether the controller welcomed it before it ended."""
        headers = [(b"authorization", f"Bearer {self.credential}".encode())]
        try:
            connection = open_websocket_url(
                self.url, self.ssl_context, extra_headers=headers, connect_timeout=15
            )
            async with connection as ws:
                welcome = decode(await ws.get_message())
                if welcome.get("type") != "welcome":
                    raise AgentRefused(f"the controller said {welcome!r} instead of welcome")
                node_id = str(welcome["node_id"])
                if self.agent is None:
                    self.agent = self.make_agent(node_id)
                    await nursery.start(self.agent.run)
                elif self.agent.node_id != node_id:
                    raise AgentRefused(
                        f"this agent runs node {self.agent.node_id!r}; the credential is "
                        f"for {node_id!r}",
                        code="node_mismatch",
                    )
                agent = self.agent
                agent.lease_duration = float(welcome["lease_duration"])
                self.sessions += 1
                if self.sessions == 1:
                    task_status.started(agent)
                if self.on_connected is not None:
                    self.on_connected(node_id)
                outcome = await self._converse(ws, agent, float(welcome["heartbeat_interval"]))
                if outcome is not None:
                    raise outcome
                return True
        except ConnectionRejected as exc:
            if exc.status_code in (401, 403):
                raise AgentRefused(
                    f"the controller refused the node credential: {_body_message(exc.body)}",
                    code="credential_refused",
                ) from None
            raise

    async def _converse(self, ws: Any, agent: Agent, interval: float) -> FiccError | None:
        """Heartbeat in one task, apply renewals in another; return why it ended."""
        outcome: list[FiccError] = []
        async with trio.open_nursery() as session:

            async def heartbeat() -> None:
                try:
                    while True:
                        snapshot = unstructure(await agent.snapshot())
                        attempts = await agent.report()
                        message = {"type": "heartbeat", "snapshot": snapshot, "attempts": attempts}
                        await ws.send_message(json.dumps(message))
                        await trio.sleep(interval)
                except _TRANSIENT:
                    session.cancel_scope.cancel()

            session.start_soon(heartbeat)
            # Relayed endpoint streams: their own tasks, so nothing below waits on them.
            relay = RelayServer(agent, ws.send_message)
            self.relay = relay
            await session.start(relay.run)
            try:
                while True:
                    raw = await ws.get_message()
                    if isinstance(raw, bytes):
                        relay.deliver_binary(raw)
                        continue
                    message = decode(raw)
                    kind = message.get("type")
                    if kind == "renew":
                        agent.renew(duration=float(message["duration"]))
                    elif kind == "relay":
                        relay.deliver(message)
                    elif kind == "command":
                        session.start_soon(_reply, ws, agent, message)
                    elif kind == "fenced":
                        outcome.append(
                            AgentRefused(
                                f"a newer connection of node {agent.node_id!r} replaced this one",
                                code="connection_fenced",
                            )
                        )
                        break
                    elif kind == "error":
                        outcome.append(
                            AgentRefused(
                                f"the controller ended the connection: {message.get('message')}",
                                code=str(message.get("code", "agent_refused")),
                            )
                        )
                        break
            except _TRANSIENT as exc:
                log.warning("connection to %s lost: %r", self.url, exc)
            session.cancel_scope.cancel()
        return outcome[0] if outcome else None


async def _reply(ws: Any, agent: Agent, message: dict[str, Any]) -> None:
    reply = await run_command(agent, message)
    try:
        await ws.send_message(
            json.dumps({**reply, "type": "reply", "request_id": message.get("request_id")})
        )
    except _TRANSIENT:
        pass  # the controller is gone; it fails the command on its side


def _first(group: BaseExceptionGroup) -> Any:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


def _body_message(body: bytes | None) -> str:
    try:
        return json.loads(body or b"{}")["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return (body or b"").decode("utf-8", "replace")[:200] or "no reason given"
