"""A database outage on demand: a real store whose reads and writes fail while a switch is on.

:func:`store_outage` switches the store every component of a controller shares (the
very object, so nothing is rebuilt around it): while :attr:`StoreOutage.down` holds,
each ``read`` and ``write`` raises what a store raises when its database cannot be
reached (:class:`~ficc_core.base.errors.StoreUnavailable`, or with ``raw`` a driver's
own error, SQLite's ``OperationalError``), after a checkpoint, as a real one would;
with :attr:`StoreOutage.hang` a call answers nothing until :meth:`StoreOutage.end`.
A transaction already running when the switch turns finishes as it would have.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from ficc_core.base.errors import StoreUnavailable


class StoreOutage:
    """The switch (see the module docs); :attr:`refused` counts the calls it failed."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.down = False
        #: Raise SQLite's own ``OperationalError`` instead of ``StoreUnavailable``.
        self.raw = False
        #: Calls do not answer until the outage ends (a database that does not answer
        #: at all), then fail.
        self.hang = False
        self.refused = 0
        self._ended = trio.Event()
        self._read, self._write = store.read, store.write
        self._lease_write = store.lease_write

    def end(self) -> None:
        """The database is back: calls go through again, and those hanging fail now."""
        self.down = False
        self._ended.set()
        self._ended = trio.Event()

    async def _fail(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.hang:
            await self._ended.wait()
        self.refused += 1
        if self.raw:
            raise sqlite3.OperationalError("disk I/O error")
        raise StoreUnavailable("the database is down (a test's outage)")

    async def read(self, fn: Any) -> Any:
        if self.down:
            await self._fail()
        return await self._read(fn)

    async def write(self, fn: Any) -> Any:
        if self.down:
            await self._fail()
        return await self._write(fn)

    async def lease_write(self, fn: Any, bound: float) -> Any:
        if self.down:
            await self._fail()
        return await self._lease_write(fn, bound)

    def restore(self) -> None:
        """The store as it was (its own methods again)."""
        self.store.read, self.store.write = self._read, self._write
        self.store.lease_write = self._lease_write


@contextmanager
def store_outage(store: Any) -> Iterator[StoreOutage]:
    """Put the switch on ``store`` (off at first) for the ``with`` block."""
    outage = StoreOutage(store)
    store.read, store.write = outage.read, outage.write
    store.lease_write = outage.lease_write
    try:
        yield outage
    finally:
        outage.end()
        outage.restore()
