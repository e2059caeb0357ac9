"""The node connections this controller process serves, and the links to reach them.

One connection per node: a newer connection (or a revocation) cancels the older
one's scope at once, in process; the store's connection ID fences out heartbeats
from connections served elsewhere. Commands and the endpoint action reach a node
only through the link of its live connection here.
"""

from __future__ import annotations

import attrs
import trio

from ..nodelink.links import NodeLink
from ..nodelink.wire import NodeGone


@attrs.frozen
class LiveConnection:
    """One served connection: its ID, the scope that ends it, and its link (if any)."""

    connection_id: str
    scope: trio.CancelScope
    link: NodeLink | None


class LiveConnections:
    """The live connection of each node connected to this process, by node ID."""

    def __init__(self) -> None:
        self._by_node: dict[str, LiveConnection] = {}
        #: Set once the controller is stopping (:meth:`end_all`): a connection that ends
        #: now tells its agent so (``goodbye``), and a new one is told at once.
        self.closing = False

    def replace(
        self,
        node_id: str,
        connection_id: str,
        scope: trio.CancelScope | None,
        link: NodeLink | None,
    ) -> None:
        """Cancel the node's older connection; remember this one when it has a ``scope``."""
        self.end(node_id)
        if scope is not None:
            self._by_node[node_id] = LiveConnection(connection_id, scope, link)

    def end(self, node_id: str) -> None:
        """Cancel and forget the node's connection (a newer one or a revocation took over)."""
        older = self._by_node.pop(node_id, None)
        if older is not None:
            older.scope.cancel()

    def end_all(self) -> None:
        """Cancel every connection (the controller is stopping); each is forgotten when
        its handler ends, after telling its agent that the controller is going away."""
        self.closing = True
        for live in list(self._by_node.values()):
            live.scope.cancel()

    def cancel(self, node_id: str) -> bool:
        """Cancel the node's connection, as a dropped network would; return whether it had one.

        It is forgotten when its handler ends (:meth:`forget`); the agent reconnects.
        """
        live = self._by_node.get(node_id)
        if live is not None:
            live.scope.cancel()
        return live is not None

    def forget(self, node_id: str, connection_id: str) -> None:
        """Forget ``connection_id`` once it ended (a no-op when a newer one replaced it)."""
        live = self._by_node.get(node_id)
        if live is not None and live.connection_id == connection_id:
            del self._by_node[node_id]

    def replaced(self, node_id: str, connection_id: str) -> bool:
        """Whether a newer connection of the node took over from ``connection_id``."""
        live = self._by_node.get(node_id)
        return live is not None and live.connection_id != connection_id

    def link(self, node_id: str) -> NodeLink | None:
        """The link of the node's live connection here, or None."""
        live = self._by_node.get(node_id)
        return None if live is None else live.link

    def require_link(self, node_id: str, action: str | None = None) -> NodeLink:
        """The link of a node connected to this controller, or :class:`NodeGone` (502, its
        agent is unreachable; ``action``: what needed it, in the details)."""
        link = self.link(node_id)
        if link is None:
            raise NodeGone("not connected to this controller", node=node_id, action=action)
        return link
