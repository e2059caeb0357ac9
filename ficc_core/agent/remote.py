"""The remote agent's transport: dial out to every controller over a WebSocket, stay connected.

The agent connects (so it works behind NAT), over TLS when a controller URL is
https, authenticated by its node credential. An installation may run several
controllers (one leader, standbys); the agent keeps one link to each, every link
with its own backoff, and one :class:`~ficc_core.agent.Agent` behind them all,
built when the first controller names the node. On each link the controller
names the node in its welcome (with its ``role``, ``leader`` or ``standby``, and
its leader ``term``); the agent then heartbeats its snapshot and attempts every
``heartbeat_interval`` seconds from one task and applies lease renewals as they
arrive in another, so neither waits on the other; commands and relayed endpoint
streams (:mod:`~ficc_core.nodelink.relay_node`) are answered on the link they came
on, in tasks of their own. Launches, stops and renewals carry the sender's term
and are fenced by it (:mod:`~ficc_core.nodelink.commands`), so only the current
leader changes what runs, while the endpoint action works through any controller.

A dropped connection is retried with exponential backoff (0.5 s doubling to 30 s,
with jitter); a controller that says it is stopping (``goodbye``) is dialled again
the same way, logged at info rather than as a lost connection until it is back. A
refused credential, a second controller naming another node, or being fenced out
by a newer connection of the same node ends that link. The agent ends when every
link has ended so.

The agent names its node protocol version when it dials (``Ficc-Node-Protocol``) and
the controller its own in the welcome; each takes the other one minor version older
or newer, and both then speak the older of the two (a snapshot field of a newer
version is not sent to a controller that would not know it). A controller outside
that window (426 ``protocol_version_unsupported``, or a welcome this agent refuses)
is logged as an error naming what to upgrade and dialled again with backoff: an
upgrade in progress ends that way (docs/operations.md, "Upgrading a fleet").
"""

from __future__ import annotations

import json
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

from ..base.errors import FiccError
from ..nodelink.commands import run_command
from ..nodelink.relay_node import RelayServer
from ..nodelink.wire import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    ProtocolMismatch,
    at_least,
    decode,
    message_term,
    negotiate,
)
from ..schema import unstructure
from .agent import Agent
from .staging import stager_from_settings

log = logging.getLogger("ficc.agent")

CONNECT_PATH = "/api/v1/contributors/connect"
_TRANSIENT = (
    OSError,
    HandshakeError,
    ConnectionClosed,
    trio.BrokenResourceError,
    ValueError,
    KeyError,
    TypeError,
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


@attrs.frozen
class Welcome:
    """What a controller said of itself when it welcomed this node (or later turned leader).

    ``role`` is ``leader`` or ``standby``, or None from a controller built before
    there could be a second one (it is the leader then); ``term`` is its leader term.
    """

    controller: str
    node_id: str
    role: str | None
    term: int

    @property
    def leads(self) -> bool:
        """Whether this controller places work (a controller without roles does)."""
        return self.role != "standby"


class RemoteAgent:
    """Keep one agent connected to every controller of its installation.

    :param controllers: the controllers' base URLs (``https://ficc.example:8484``), in
        the order blobs are fetched from them; one URL (a string) is the one-controller case.
    :param credential: the node credential from ``ficc admin add-node``.
    :param make_agent: builds the :class:`Agent` once the first controller has named the node;
        one built without a :attr:`~Agent.stager` gets one that stages its inputs from
        these controllers, in order, into ``<state_dir>/blobs`` (``[staging]`` settings).
    :param ssl_context: trust for https controllers (default: the system's).
    :param on_connected: called with each :class:`Welcome`, and again when a standby's
        link turns leader.
    """

    def __init__(
        self,
        controllers: str | Sequence[str],
        credential: str,
        make_agent: Callable[[str], Agent],
        *,
        ssl_context: ssl.SSLContext | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        on_connected: Callable[[Welcome], None] | None = None,
    ) -> None:
        urls = [controllers] if isinstance(controllers, str) else list(controllers)
        if not urls:
            raise AgentRefused("give at least one controller URL", code="bad_controller_url")
        self.credential = credential
        self.make_agent = make_agent
        self.ssl_context = ssl_context
        if ssl_context is None and any(websocket_url(url).startswith("wss:") for url in urls):
            self.ssl_context = ssl.create_default_context()
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.on_connected = on_connected
        #: One link per controller, in the order given (a URL given twice is one link).
        self.links = [ControllerLink(self, url) for url in dict.fromkeys(urls)]
        self.agent: Agent | None = None
        self._agent_ready = trio.Event()
        self._welcomed = trio.Event()

    @property
    def url(self) -> str:
        """The first controller's WebSocket URL."""
        return self.links[0].url

    @property
    def sessions(self) -> int:
        """How many sessions the controllers welcomed, all links together (reconnects show)."""
        return sum(link.sessions for link in self.links)

    @property
    def relay(self) -> RelayServer | None:
        """The first link's current relayed streams (the one-controller case's)."""
        return self.links[0].relay

    @property
    def leader(self) -> ControllerLink | None:
        """The link whose controller said last that it leads, while it is connected."""
        leading = [link for link in self.links if link.connected and link.leads]
        return max(leading, key=lambda link: link.term, default=None)

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect every link, and reconnect each with backoff, until cancelled or refused.

        Reports the agent as started after the first welcome on any link. Raises
        :class:`AgentRefused` (the first link's refusal) once every link has been
        refused: a bad credential, a controller naming another node, or a newer
        connection of this node fencing this one out.
        """
        refusals: dict[int, AgentRefused] = {}
        async with trio.open_nursery() as nursery:

            async def keep(index: int, link: ControllerLink) -> None:
                refused = await link.keep_connected(nursery)
                log.error("controller %s: %s [%s]", link.controller, refused.message, refused.code)
                refusals[index] = refused
                if len(refusals) == len(self.links):
                    self._welcomed.set()
                    nursery.cancel_scope.cancel()

            for index, link in enumerate(self.links):
                nursery.start_soon(keep, index, link)
            await self._welcomed.wait()
            if self.agent is not None and len(refusals) < len(self.links):
                task_status.started(self.agent)
        # Raised outside the nursery, so callers catch it as itself, not in a group.
        if len(refusals) == len(self.links):
            raise refusals[min(refusals)]

    async def agent_for(self, node_id: str, nursery: trio.Nursery) -> Agent:
        """The one agent, built and started the first time a controller names the node.

        Raises :class:`AgentRefused` (``node_mismatch``) when the agent runs another node.
        """
        if self.agent is None:
            agent = self.make_agent(node_id)
            if agent.stager is None:
                # A remote node reads only its own disk: the inputs it lacks (a model's
                # file, a directory model's files) are staged from the controllers first.
                agent.stager = stager_from_settings(
                    agent.state_dir,
                    [link.controller for link in self.links],
                    self.credential,
                    agent.settings,
                    ssl_context=self.ssl_context,
                )
            self.agent = agent
            await nursery.start(self.agent.run)
            self._agent_ready.set()
        await self._agent_ready.wait()
        if self.agent.node_id != node_id:
            raise AgentRefused(
                f"this agent runs node {self.agent.node_id!r}; the credential is for {node_id!r}",
                code="node_mismatch",
            )
        return self.agent

    def welcomed(self, welcome: Welcome) -> None:
        """A link was welcomed (or its controller turned leader): tell the caller."""
        self._welcomed.set()
        if self.on_connected is not None:
            self.on_connected(welcome)


class ControllerLink:
    """This node's connection to one controller: backoff, heartbeats, renewals, commands.

    :param remote: the :class:`RemoteAgent` it belongs to (the shared agent, credential, trust).
    :param controller: the controller's base URL.
    """

    def __init__(self, remote: RemoteAgent, controller: str) -> None:
        self.remote = remote
        self.controller = controller
        self.url = websocket_url(controller)
        #: How many sessions this controller welcomed.
        self.sessions = 0
        #: Whether a session is welcomed and running now.
        self.connected = False
        #: The controller's role and term, as it last said (None before a welcome).
        self.role: str | None = None
        self.term = 0
        #: The current session's relayed endpoint streams (None before the first).
        self.relay: RelayServer | None = None
        #: Heartbeats sent on this link, all sessions together.
        self.heartbeats = 0
        #: Connections the controller ended because it was stopping (``goodbye``).
        self.goodbyes = 0
        #: Whether the controller said it was stopping and has not welcomed us since.
        self.away = False
        #: The node protocol version spoken with this controller (the older of the two).
        self.protocol = (1, 0)

    @property
    def leads(self) -> bool:
        """Whether this controller said it places work (see :attr:`Welcome.leads`)."""
        return self.role != "standby"

    async def keep_connected(self, nursery: trio.Nursery) -> AgentRefused:
        """Connect, and reconnect with backoff, until refused; return the refusal."""
        delay = self.remote.backoff_initial
        while True:
            try:
                welcomed = await self._session(nursery)
            except AgentRefused as exc:
                return exc
            except ProtocolMismatch as exc:
                welcomed = False
                log.error("controller %s: %s [%s]", self.controller, exc.message, exc.code)
            except _TRANSIENT as exc:
                welcomed = False
                log.log(self._unreachable_level(), "controller %s unreachable: %r", self.url, exc)
            except BaseExceptionGroup as group:
                refused, rest = group.split(AgentRefused)
                if refused is not None:
                    return _first(refused)
                assert rest is not None  # nothing was refused: the rest is the group
                _, unexpected = rest.split(_TRANSIENT)
                if unexpected is not None:
                    raise
                welcomed = False
                log.log(self._unreachable_level(), "controller %s unreachable: %r", self.url, group)
            finally:
                self.connected = False
            if welcomed:
                delay = self.remote.backoff_initial
            await trio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.remote.backoff_max)

    def _goodbye(self) -> None:
        """The controller said it is stopping: reconnect as usual, with no warning."""
        self.goodbyes += 1
        self.away = True
        log.info("controller %s is shutting down; reconnecting once it is back", self.controller)

    def _unreachable_level(self) -> int:
        """A controller that said it was stopping is expected away: info, not a warning."""
        return logging.INFO if self.away else logging.WARNING

    async def _session(self, nursery: trio.Nursery) -> bool:
        """One connection: return whether the controller welcomed it before it ended."""
        headers = [
            (b"authorization", f"Bearer {self.remote.credential}".encode()),
            (PROTOCOL_HEADER.lower().encode(), PROTOCOL_VERSION.encode()),
        ]
        try:
            connection = open_websocket_url(
                self.url, self.remote.ssl_context, extra_headers=headers, connect_timeout=15
            )
            async with connection as ws:
                welcome = decode(await ws.get_message())
                if welcome.get("type") == "goodbye":
                    # It is stopping as we dial: come back later, as after a drop.
                    self._goodbye()
                    return False
                if welcome.get("type") != "welcome":
                    raise AgentRefused(f"the controller said {welcome!r} instead of welcome")
                node_id = str(welcome["node_id"])
                self.protocol = negotiate(
                    PROTOCOL_VERSION, welcome.get("protocol_version"), refusing="agent"
                )
                agent = await self.remote.agent_for(node_id, nursery)
                role = welcome.get("role")
                self.role = None if role is None else str(role)
                self.term = _welcome_term(welcome)
                if self.leads:
                    agent.lease_duration = float(welcome["lease_duration"])
                if self.role == "leader":
                    await agent.see_term(self.term)
                self.sessions += 1
                self.connected = True
                self.away = False
                log.info(
                    "controller %s welcomed node %s as %s (term %d, protocol %d.%d)",
                    self.controller,
                    node_id,
                    self.role or "the only controller",
                    self.term,
                    *self.protocol,
                )
                self.remote.welcomed(Welcome(self.controller, node_id, self.role, self.term))
                outcome = await self._converse(ws, agent, float(welcome["heartbeat_interval"]))
                if outcome is not None:
                    raise outcome
                return True
        except ConnectionRejected as exc:
            if exc.status_code == ProtocolMismatch.status:
                details = _body_error(exc.body).get("details")
                raise ProtocolMismatch(
                    f"the controller refused this agent: {_body_message(exc.body)}",
                    details=details if isinstance(details, dict) else None,
                ) from None
            if exc.status_code in (401, 403):
                raise AgentRefused(
                    f"the controller refused the node credential: {_body_message(exc.body)}",
                    code="credential_refused",
                ) from None
            raise

    async def _renewal(self, agent: Agent, message: dict[str, Any]) -> None:
        """Apply a renewal: a newer term raises the node's; an older one extends nothing."""
        try:
            term = message_term(message)
        except FiccError:
            log.warning("controller %s sent a renewal with a malformed term", self.controller)
            return
        if term > agent.term_seen:
            await agent.see_term(term)
        if term > self.term or self.role == "standby":
            # Only the leader renews: a standby's link that renews has taken over.
            self.role, self.term = "leader", max(term, self.term)
            log.info("controller %s leads now (term %d)", self.controller, self.term)
            self.remote.welcomed(Welcome(self.controller, agent.node_id, self.role, self.term))
        agent.renew(duration=float(message["duration"]), term=term)

    async def _converse(self, ws: Any, agent: Agent, interval: float) -> FiccError | None:
        """Heartbeat in one task, apply renewals in another; return why it ended."""
        outcome: list[FiccError] = []
        async with trio.open_nursery() as session:

            async def heartbeat() -> None:
                try:
                    while True:
                        snapshot = unstructure(await agent.snapshot())
                        if at_least(self.protocol, "1.1"):
                            snapshot["protocol_version"] = PROTOCOL_VERSION
                        attempts = await agent.report()
                        message = {"type": "heartbeat", "snapshot": snapshot, "attempts": attempts}
                        await ws.send_message(json.dumps(message))
                        self.heartbeats += 1
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
                        await self._renewal(agent, message)
                    elif kind == "relay":
                        relay.deliver(message)
                    elif kind == "command":
                        session.start_soon(_reply, ws, agent, message, self.controller)
                    elif kind == "fenced":
                        outcome.append(
                            AgentRefused(
                                f"a newer connection of node {agent.node_id!r} replaced this one",
                                code="connection_fenced",
                            )
                        )
                        break
                    elif kind == "goodbye":
                        # The controller is stopping: no trouble, reconnect as usual.
                        self._goodbye()
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


async def _reply(ws: Any, agent: Agent, message: dict[str, Any], origin: str) -> None:
    reply = await run_command(agent, message, origin=origin)
    try:
        await ws.send_message(
            json.dumps({**reply, "type": "reply", "request_id": message.get("request_id")})
        )
    except _TRANSIENT:
        pass  # the controller is gone; it fails the command on its side


def _welcome_term(welcome: dict[str, Any]) -> int:
    """The term a welcome names (0 from a controller without terms); ValueError if malformed."""
    try:
        return message_term(welcome)
    except FiccError as exc:
        raise ValueError(f"the controller's welcome is malformed: {exc.message}") from None


def _first(group: BaseExceptionGroup) -> Any:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


def _body_error(body: bytes | None) -> dict[str, Any]:
    try:
        error = json.loads(body or b"{}")["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return error if isinstance(error, dict) else {}


def _body_message(body: bytes | None) -> str:
    message = _body_error(body).get("message")
    if isinstance(message, str):
        return message
    return (body or b"").decode("utf-8", "replace")[:200] or "no reason given"
