"""The controller's end of commands: one interface, to a local agent or over a connection.

The embedded agent answers in-process (:class:`LocalNodeLink`); a remote one answers
over its WebSocket (:class:`ConnectionLink`). Both go through the same wire forms
(:func:`~ficc_core.nodelink.commands.run_command` and
:func:`~ficc_core.nodelink.wire.raise_for_reply`), so a refusal arrives as the same
class either way.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import trio

from ..executor.protocol import EndpointAction
from ..schema import Fence
from .commands import CommandTarget, run_command
from .relay_controller import RelayEndpoint
from .relay_node import RelaySource
from .wire import NodeGone, NodeTimeout, raise_for_reply


class MessageChannel(Protocol):
    """What a node connection runs over (the WebSocket route passes Quart's)."""

    async def send(self, data: str | bytes) -> None:
        """Send one text (str) or binary (bytes) message."""

    async def receive(self) -> str | bytes:
        """Receive one message."""


class NodeLink(Protocol):
    """Carries one command to a node and returns its reply (raising the node's refusal)."""

    @property
    def endpoint(self) -> EndpointAction:
        """The node's endpoint action."""
        ...

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run ``message`` on the node; return the reply of a successful command."""

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """The attempt's log lines on the node (the last ``tail``, then new ones) until
        it ends; closing the iterator ends the follow on the node."""


class LocalAgent(CommandTarget, RelaySource, Protocol):
    """An agent in this process: commands, the endpoint action and log follows, called
    directly."""


class LocalNodeLink:
    """The embedded agent's link: commands run in this process, no wire between.

    A command reaches the agent exactly as it would travel, ``term`` included (the
    node registry stamps every command with its controller's term), so the agent's
    ``stale_term`` check holds in process too.
    """

    def __init__(self, agent: LocalAgent) -> None:
        self.agent = agent
        #: The endpoint action: the agent's own, called directly.
        self.endpoint: EndpointAction = agent

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run ``message`` on the local agent."""
        return raise_for_reply(await run_command(self.agent, message))

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """Follow the attempt's log on the local agent."""
        return self.agent.follow_logs(fence, tail)


class ConnectionLink:
    """Commands to a remote node over its connection, each matched to its reply by ID."""

    def __init__(
        self, channel: MessageChannel, *, timeout: float = 60.0, node: str | None = None
    ) -> None:
        self.channel = channel
        self.timeout = timeout
        #: The node's name, for the refusals that say its agent is unreachable.
        self.node = node
        self._pending: dict[str, list[Any]] = {}
        self._closed = False
        #: The node's endpoint action, relayed over this connection.
        self.endpoint = RelayEndpoint(channel.send, node=node)

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one command and wait (bounded) for its reply."""
        if self._closed:
            raise NodeGone("its connection closed", node=self.node)
        request_id = secrets.token_hex(8)
        slot: list[Any] = [trio.Event()]
        self._pending[request_id] = slot
        try:
            await self.channel.send(
                json.dumps({**message, "type": "command", "request_id": request_id})
            )
            with trio.fail_after(self.timeout):
                await slot[0].wait()
        except trio.TooSlowError:
            raise NodeTimeout(str(message.get("op")), self.timeout, node=self.node) from None
        finally:
            self._pending.pop(request_id, None)
        if len(slot) == 1:
            raise NodeGone("its connection closed", node=self.node)
        return raise_for_reply(slot[1])

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """Follow the attempt's log on the node, relayed within the stream window."""
        return self.endpoint.follow_logs(fence, tail)

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a reply to the command waiting for it (unknown IDs are dropped)."""
        slot = self._pending.get(str(message.get("request_id")))
        if slot is not None and len(slot) == 1:
            slot.append(message)
            slot[0].set()

    def close(self) -> None:
        """Fail every waiting command: peer loss ends them without replay."""
        self._closed = True
        for slot in self._pending.values():
            slot[0].set()
        self.endpoint.close()
