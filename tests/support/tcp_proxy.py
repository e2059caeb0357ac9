"""A small TCP proxy in trio that can stop forwarding without closing anything.

What a hung database looks like from a controller: packets dropped by a firewall, a
proxy or a stalled path. Every connection stays open (nothing is reset or closed, and
the proxy's kernel acknowledges what the client sends, so no TCP timer on the client
fires), but nothing goes through until :meth:`TcpProxy.resume`; bytes read while
paused are held and forwarded then. Connections opened while paused are accepted and
held the same way.

    async with tcp_proxy("127.0.0.1", server_port) as proxy:
        url = f"postgresql://...@127.0.0.1:{proxy.port}/db"
        proxy.pause()
        ...
        proxy.resume()
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import trio


class TcpProxy:
    """The proxy's switch and its listening port (see the module docs)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.target = port
        self.port = 0
        self.paused = False
        self._resumed = trio.Event()
        #: Connections accepted so far.
        self.accepted = 0

    def pause(self) -> None:
        """Stop forwarding (in both directions), closing nothing."""
        self.paused = True

    def resume(self) -> None:
        """Forward again, what was held first."""
        self.paused = False
        self._resumed.set()
        self._resumed = trio.Event()

    async def _gate(self) -> None:
        while self.paused:
            await self._resumed.wait()

    async def _pipe(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while True:
                data = await source.receive_some(65536)
                await self._gate()
                if not data:
                    await sink.send_eof()
                    return
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return

    async def _serve(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        async with client:
            await self._gate()
            try:
                server = await trio.open_tcp_stream(self.host, self.target)
            except OSError:
                return
            async with server, trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, client, server)
                nursery.start_soon(self._pipe, server, client)


@asynccontextmanager
async def tcp_proxy(host: str, port: int) -> AsyncIterator[TcpProxy]:
    """A :class:`TcpProxy` to ``host:port`` on a free loopback port, for the block."""
    proxy = TcpProxy(host, port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, proxy._serve, 0, host="127.0.0.1"))
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
