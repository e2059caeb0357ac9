"""Let a response's last send finish before its own ``http.disconnect`` is delivered.

hypercorn runs the end of a response inside the app's last ``send`` (the
``http.response.body`` without ``more_body``): it closes the stream, which puts an
``http.disconnect`` in the app's receive queue, and only then marks the connection
idle (restarting its idle task, the one that closes a kept-alive connection after
``keep_alive_timeout``, or at once when the server shuts down). An app that waits on
``receive()`` while it sends (quart-trio's connection, the invoke routes' watcher)
gets that disconnect in the middle of the send and cancels the sender: the send ends
before the connection is marked idle, so no idle task runs, and hypercorn counts the
kept-alive connection as busy until the client closes it. On shutdown it then waited
out the whole grace for each idle keep-alive connection.

:class:`ResponseEnd` holds such a disconnect back until the last send returns, so
the send completes (the connection is idle again); a disconnect that comes at any
other time, a client leaving mid-request, is delivered at once, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


class ResponseEnd:
    """ASGI middleware: an HTTP response's last send is not cancelled by the disconnect
    that the send itself causes (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ending = False
        ended = trio.Event()

        async def receive_after_end() -> Message:
            message = await receive()
            if ending and message["type"] == "http.disconnect":
                await ended.wait()
            return message

        async def send_end(message: Message) -> None:
            nonlocal ending
            if message["type"] != "http.response.body" or message.get("more_body", False):
                await send(message)
                return
            ending = True
            try:
                await send(message)
            finally:
                ended.set()

        await self.app(scope, receive_after_end, send_end)
