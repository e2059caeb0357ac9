"""Single-use stream tickets: what opens a stream from a URL, instead of a credential.

A browser's ``EventSource`` cannot send an ``Authorization`` header, and a long-lived
credential must never appear in a URL (proxies, access logs and browser history keep
URLs). So a caller authenticated the usual way mints a ticket for one stream (a
``purpose`` and a ``subject``, such as the logs of one replica), and the stream's
URL carries the ticket alone.

A ticket lives :data:`TICKET_LIFETIME` seconds and opens its stream once. Only its
sha256 is stored, with the caller it was minted for; redeeming it is one atomic
``UPDATE ... WHERE used_at IS NULL AND expires_at > now`` that also requires that
caller's credential to be unrevoked and unexpired (or its session still open), so
two controllers sharing the store never both accept it, and revoking the caller
invalidates its tickets. Every refusal is the same 401 ``ticket_invalid`` with the
reason in its details.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import attrs

from ..base.errors import Unauthenticated
from ..store import Store, Transaction
from . import secrets as sec
from .principal import Principal, PrincipalKind

#: Seconds a ticket stays redeemable.
TICKET_LIFETIME = 60.0
TICKET_PREFIX = "ftk_"
#: Seconds a spent or expired ticket's row is kept before a later mint removes it.
_KEPT = 3600.0


class TicketRefused(Unauthenticated):
    """The ticket does not open this stream: unknown, used, expired, another stream's,
    or its caller's credential is no longer valid."""

    code = "ticket_invalid"


@attrs.frozen(kw_only=True)
class Ticket:
    """A redeemed ticket: the stream it opened and who it was minted for."""

    purpose: str
    subject: str
    principal_kind: PrincipalKind = attrs.field(converter=PrincipalKind)
    principal_id: str
    principal_expires_at: float | None
    project_id: str
    expires_at: float

    def principal(self) -> Principal:
        """The caller, as far as a stream needs it: whose authority it checks while open.

        It carries no scopes: the ticket was minted under them, and opens only its stream.
        """
        return Principal(
            kind=self.principal_kind,
            id=self.principal_id,
            project_id=self.project_id,
            project_name="",
            scopes=frozenset(),
            expires_at=self.principal_expires_at,
        )


#: The caller still holds its authority: an unrevoked, unexpired credential, or an open
#: session (logging out deletes it). ``?`` is the time of redemption, twice.
_CALLER_VALID = (
    "((t.principal_kind = 'credential' AND EXISTS (SELECT 1 FROM credentials c"
    " WHERE c.id = t.principal_id AND c.revoked_at IS NULL"
    " AND (c.expires_at IS NULL OR c.expires_at > ?)))"
    " OR (t.principal_kind = 'session' AND EXISTS (SELECT 1 FROM sessions s"
    " WHERE s.id = t.principal_id AND s.expires_at > ?)))"
)


class Tickets:
    """Mints and redeems stream tickets, through the :class:`Store`.

    :param lifetime: seconds a ticket stays redeemable.
    :param clock: wall-clock seconds (tests pass their own and move it).
    """

    def __init__(
        self,
        store: Store,
        *,
        lifetime: float = TICKET_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.lifetime = lifetime
        self.clock = clock

    async def mint(self, principal: Principal, purpose: str, subject: str) -> tuple[str, float]:
        """A new ticket for ``principal`` that opens the stream ``(purpose, subject)`` once;
        return it and when it expires."""
        ticket = TICKET_PREFIX + sec.new_secret()
        now = self.clock()
        expires_at = now + self.lifetime

        def write(tx: Transaction) -> None:
            tx.execute("DELETE FROM stream_tickets WHERE expires_at < ?", (now - _KEPT,))
            tx.execute(
                "INSERT INTO stream_tickets (ticket_hash, purpose, subject, principal_kind,"
                " principal_id, principal_expires_at, project_id, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sec.hash_secret(ticket),
                    purpose,
                    subject,
                    str(principal.kind),
                    principal.id,
                    principal.expires_at,
                    principal.project_id,
                    now,
                    expires_at,
                ),
            )

        await self.store.write(write)
        return ticket, expires_at

    async def redeem(self, ticket: str, purpose: str, subject: str) -> Ticket:
        """Use ``ticket`` to open the stream ``(purpose, subject)``; raise
        :class:`TicketRefused` unless this is its first use, in time, for this stream,
        with its caller still authorised."""
        if not ticket.startswith(TICKET_PREFIX):
            raise _refused("missing" if not ticket else "unknown")
        digest = sec.hash_secret(ticket)
        now = self.clock()
        return await self.store.write(
            partial(_redeem, digest=digest, purpose=purpose, subject=subject, now=now)
        )


def _redeem(tx: Transaction, *, digest: str, purpose: str, subject: str, now: float) -> Ticket:
    used = tx.execute(
        "UPDATE stream_tickets AS t SET used_at = ? WHERE t.ticket_hash = ?"
        " AND t.used_at IS NULL AND t.expires_at > ? AND t.purpose = ? AND t.subject = ?"
        f" AND {_CALLER_VALID}",
        (now, digest, now, purpose, subject, now, now),
    )
    row = tx.fetch_one(
        "SELECT purpose, subject, principal_kind, principal_id, principal_expires_at,"
        " project_id, expires_at, used_at FROM stream_tickets WHERE ticket_hash = ?",
        (digest,),
    )
    if used == 1 and row is not None:
        del row["used_at"]
        return Ticket(**row)
    # Say why, most telling first (nothing changed: the ticket keeps its state).
    if row is None:
        raise _refused("unknown")
    if (row["purpose"], row["subject"]) != (purpose, subject):
        raise _refused("another_stream")
    if row["used_at"] is not None:
        raise _refused("used")
    if row["expires_at"] <= now:
        raise _refused("expired")
    raise _refused("caller_invalid")


_MESSAGES = {
    "missing": "this stream needs a ticket: POST to its ticket route (with your credential) "
    "and pass the ticket as ?ticket=",
    "unknown": "the ticket is not valid; mint a new one",
    "another_stream": "the ticket was minted for another stream; mint one for this stream",
    "used": "the ticket was already used (a ticket opens one stream once); mint a new one",
    "expired": f"the ticket expired (tickets last {TICKET_LIFETIME:g} s); mint a new one",
    "caller_invalid": "the credential or session that minted the ticket was revoked, "
    "logged out or expired",
}


def _refused(reason: str) -> TicketRefused:
    return TicketRefused(_MESSAGES[reason], details={"reason": reason})
