"""Enrolment: registering nodes, their node credentials, and revoking them.

A node is registered by an administrator (``ficc admin add-node``), which issues
a node credential: a bearer secret that can do nothing but connect as that one
node (and download its assigned inputs). Only the secret's hash is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..auth import secrets as sec
from ..base.errors import InvalidRequest
from ..schema.spec import NODE_ID_PATTERN
from ..store import Store, Transaction
from . import repository
from .errors import InvalidNodeCredential, NodeCredentialRevoked, NodeExists, NodeNotFound
from .records import Node, NodeState
from .states import forget_attempts, node_changed

#: Node credentials look like ``ficcnode_<credential id>.<secret>``; bearer tokens never do.
NODE_TOKEN_PREFIX = "ficcnode_"
#: The label that marks the embedded agent's node.
EMBEDDED_LABEL = "ficc/embedded"


def is_node_token(token: str) -> bool:
    """Whether ``token`` is (shaped like) a node credential."""
    return token.startswith(NODE_TOKEN_PREFIX)


def read_node(tx: Transaction, node_id: str) -> Node:
    """The node ``node_id`` in ``tx``, or :class:`NodeNotFound`."""
    node = repository.fetch_node(tx, node_id)
    if node is None:
        raise NodeNotFound(node_id)
    return node


class NodeEnrolment:
    """Registers nodes, checks their credentials and revokes them, through the store.

    :param clock: wall-clock seconds.
    """

    def __init__(self, store: Store, *, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock

    async def add_node(
        self, name: str, *, labels: Mapping[str, str] | None = None
    ) -> tuple[Node, str]:
        """Register node ``name``; return it and its credential (shown only once)."""
        if not NODE_ID_PATTERN.fullmatch(name):
            raise InvalidRequest(
                f"{name!r} is not a node name: use up to 63 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
                details={"errors": [{"path": "$.name", "message": "not a node name"}]},
            )
        credential_id, secret, now = sec.new_id(), sec.new_secret(), self.clock()

        def insert(tx: Transaction) -> Node:
            if repository.name_taken(tx, name):
                raise NodeExists(name)
            repository.insert_node(
                tx,
                name=name,
                labels=labels or {},
                credential_id=credential_id,
                secret_hash=sec.hash_secret(secret),
                created_at=now,
            )
            return read_node(tx, name)

        node = await self.store.write(insert)
        return node, sec.make_token(credential_id, secret, NODE_TOKEN_PREFIX)

    async def ensure_local_node(self, name: str) -> Node:
        """Register the embedded agent's node if it is not yet (its credential is unused)."""
        found = await self.store.read(lambda tx: repository.fetch_node(tx, name))
        if found is not None:
            return found
        try:
            node, _ = await self.add_node(name, labels={EMBEDDED_LABEL: "true"})
        except NodeExists:
            return await self.store.read(lambda tx: read_node(tx, name))
        return node

    async def revoke(self, node_id: str) -> Node:
        """Revoke the node's credential; what it ran becomes unknown.

        Its live connection is the caller's to end.
        """
        now = self.clock()

        def write(tx: Transaction) -> Node:
            before = read_node(tx, node_id)
            if before.revoked_at is None:
                repository.mark_revoked(tx, node_id, now)
                forget_attempts(tx, node_id, now)
                node_changed(
                    tx,
                    before,
                    NodeState.REVOKED,
                    now,
                    reason="revoked",
                    message="its credential was revoked; what it ran is unknown",
                )
            return read_node(tx, node_id)

        return await self.store.write(write)

    async def authenticate(self, token: str) -> str:
        """Return the node ID a node credential belongs to, or raise ``Unauthenticated``."""
        parts = sec.split_token(token, NODE_TOKEN_PREFIX)
        if parts is None:
            raise InvalidNodeCredential(
                "only a node credential (from 'ficc admin add-node') can connect as a node"
            )
        credential_id, secret = parts
        credential = await self.store.read(
            lambda tx: repository.fetch_credential(tx, credential_id)
        )
        if credential is None or not sec.secret_matches(secret, credential.secret_hash):
            raise InvalidNodeCredential("the node credential is not valid")
        if credential.revoked_at is not None:
            raise NodeCredentialRevoked(credential.node_id)
        return credential.node_id
