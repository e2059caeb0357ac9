"""The embedded agent: ``ficc serve`` runs a local node in its own nursery, no network between.

It is the same :class:`Agent` the remote ``ficc executor`` runs; only the
transport differs: heartbeats go straight into the controller's node registry,
and the controller's lease renewals are a task of their own in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from ..base.errors import FiccError, Unauthenticated
from ..nodelink.links import LocalNodeLink
from .agent import Agent
from .runtimes import AgentSettings

if TYPE_CHECKING:
    from ..config import Config
    from ..controller.service import Service
    from ..plugins import PluginSet

log = logging.getLogger("ficc.agent")

#: The providers an embedded agent loads (when installed).
EMBEDDED_PROVIDERS = ("process",)


def agent_from_config(
    config: Config,
    plugins: PluginSet,
    *,
    node_id: str,
    providers: Sequence[str] = EMBEDDED_PROVIDERS,
) -> Agent:
    """Build an agent from the process's plugin set and the node's configuration.

    It gets the named executor providers of ``plugins``, the runtimes the plugins
    declare beside those of its settings file (which win by name), and its lease
    duration.
    """
    settings = AgentSettings.load(config.agent_config).beside(plugins.runtimes.declared())
    return Agent.from_plugins(
        plugins.executors,
        names=providers,
        state_dir=config.agent_path,
        runtime_dir=config.runtime_path,
        node_id=node_id,
        settings=settings,
        lease_duration=config.lease_duration,
    )


async def renew_leases(
    agent: Agent, lease_duration: float, term: Callable[[], int | None] | None = None
) -> None:
    """The controller's side of leases for one node: renew every held lease, forever.

    It is a task of its own so that nothing on a request path (an endpoint read,
    a slow engine) can delay it. ``term`` says the controller's leader term at each
    renewal (None: renew without one); a renewal of a term below the agent's
    ``term_seen`` extends nothing, as over the wire.
    """
    while True:
        current = None if term is None else term()
        if current is not None and current > agent.term_seen:
            await agent.see_term(current)
        agent.renew(duration=lease_duration, term=current)
        await trio.sleep(lease_duration / 3)


async def run_embedded_agent(
    service: Service, *, task_status: trio.TaskStatus[Agent | None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the local agent as node ``config.node_name`` until cancelled.

    Its providers and installed runtimes come from the controller's plugin set
    (``service.plugins``).
    Reports ``None`` (and returns) when no executor provider is installed, so a
    controller without one still serves its API.
    """
    config = service.config
    node_id = config.node_name
    try:
        agent = agent_from_config(config, service.plugins, node_id=node_id)
    except FiccError as exc:
        log.warning("no embedded agent: %s", exc.message)
        task_status.started(None)
        return
    await service.contributors.ensure_local_node(node_id)
    known = await service.contributors.wanted_attempt_ids(node_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.run)
        connection = await service.contributors.connect(
            node_id, nursery.cancel_scope, LocalNodeLink(agent)
        )
        try:
            attempts = await agent.report()
            await service.contributors.heartbeat(
                node_id, connection, await agent.snapshot(), attempts
            )
            # A fresh agent runs nothing: what the controller wanted here is gone.
            await service.contributors.reconcile(node_id, connection, attempts, known)
            nursery.start_soon(renew_leases, agent, config.lease_duration)
            task_status.started(agent)
            try:
                while True:
                    await trio.sleep(config.heartbeat_interval)
                    await service.contributors.heartbeat(
                        node_id, connection, await agent.snapshot(), await agent.report()
                    )
            except Unauthenticated as exc:
                # The node's credential was revoked while a heartbeat was being written
                # (between heartbeats the revocation cancels this connection): the
                # embedded node stops, as it would then, and the controller serves on.
                log.warning("the embedded node %s stops: %s", node_id, exc.message)
                nursery.cancel_scope.cancel()
        finally:
            service.contributors.disconnect(node_id, connection)
