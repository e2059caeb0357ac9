"""The invoke handler's client watch (ficc_core.http1.client_watch): a request is watched
for its client leaving only once it has lasted GRACE, or from its head on when streamed;
then a disconnect, or the send deadline, cancels the handler's work. Without the
scheduler, at once."""

from __future__ import annotations

import trio
import trio.testing

from ficc_core.http1.client_watch import GRACE, ClientWatch


class Client:
    """The ASGI ``receive`` of one request whose body was read: what comes next."""

    def __init__(self) -> None:
        self.send, self._receive = trio.open_memory_channel(10)
        self.calls = 0

    async def receive(self):
        self.calls += 1
        return await self._receive.receive()

    def leave(self) -> None:
        self.send.send_nowait({"type": "http.disconnect"})


class Response:
    closed = False

    async def aclose(self):
        self.closed = True


async def _handle(clients: ClientWatch, client: Client, work) -> tuple[bool, bool, float]:
    """Run ``work`` under the watch: (finished, client left, seconds taken)."""
    began = trio.current_time()
    finished = False
    async with clients.watching(client.receive) as watcher:
        await work(watcher)
        finished = True
    return finished, watcher.left, trio.current_time() - began


async def forever(_watcher):
    await trio.sleep_forever()


async def test_a_request_answered_within_the_grace_is_never_watched(autojump_clock):
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        client = Client()

        async def quick(_watcher):
            await trio.sleep(GRACE / 2)

        assert await _handle(clients, client, quick) == (True, False, GRACE / 2)
        await trio.sleep(GRACE * 3)  # the scheduler passes its due time
        assert client.calls == 0  # no task ever waited on the client
        clients.stop()


async def test_a_client_that_leaves_cancels_its_request_once_it_has_lasted(autojump_clock):
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        client = Client()
        client.leave()  # at once: noticed when the request is armed
        finished, left, seconds = await _handle(clients, client, forever)
        assert (finished, left) == (False, True)
        assert GRACE <= seconds <= GRACE * 1.5 + 0.01, seconds
        clients.stop()


async def test_a_lasting_request_is_cancelled_when_its_client_leaves_later(autojump_clock):
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        client = Client()

        async def leave_later():
            await trio.sleep(5)
            client.leave()

        nursery.start_soon(leave_later)
        assert await _handle(clients, client, forever) == (False, True, 5)
        # Other messages before the disconnect are not a departure.
        other = Client()
        other.send.send_nowait({"type": "http.request", "body": b""})

        async def short(_watcher):
            await trio.sleep(1)

        assert await _handle(clients, other, short) == (True, False, 1)
        assert other.calls == 2  # armed: read the message, then waited
        clients.stop()


async def test_the_send_deadline_ends_an_armed_request_and_closes_its_response(autojump_clock):
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        response = Response()

        async def relay(watcher):
            watcher.until(trio.current_time() + 3)  # before arming
            watcher.response = response
            await trio.sleep_forever()

        assert await _handle(clients, Client(), relay) == (False, False, 3)
        assert response.closed

        async def relay_late(watcher):
            await trio.sleep(1)  # armed by now
            watcher.until(trio.current_time() + 2)
            await trio.sleep_forever()

        assert await _handle(clients, Client(), relay_late) == (False, False, 3)
        clients.stop()


async def test_a_streamed_response_is_watched_from_its_start(autojump_clock):
    # A stream lasts: its client is watched from the head on, so one that closes the
    # stream early is noticed at once, not after the grace.
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        client = Client()

        async def stream(watcher):
            await trio.sleep(GRACE / 10)
            watcher.relay(Response())
            client.leave()
            await trio.sleep_forever()

        assert await _handle(clients, client, stream) == (False, True, GRACE / 10)
        # Armed once: the scheduler does not arm it again when its grace is due.
        await trio.sleep(GRACE * 2)
        assert client.calls == 1
        clients.stop()


async def test_without_the_scheduler_the_watch_starts_with_the_request(autojump_clock):
    clients = ClientWatch()  # never run: as under a test client without the lifespan
    assert not clients.running
    client = Client()
    client.leave()
    assert await _handle(clients, client, forever) == (False, True, 0)

    other = Client()

    async def quick(_watcher):
        await trio.sleep(1)

    assert await _handle(clients, other, quick) == (True, False, 1)
    assert other.calls == 1


async def test_errors_pass_through_many_requests_and_stop_ends_the_scheduler(autojump_clock):
    clients = ClientWatch()
    async with trio.open_nursery() as nursery:
        await nursery.start(clients.run)
        assert clients.running

        async def fails(_watcher):
            await trio.sleep(1)
            raise KeyError("boom")

        try:
            await _handle(clients, Client(), fails)
        except KeyError as exc:
            assert exc.args == ("boom",)
        else:
            raise AssertionError("the error was swallowed")

        # Many requests at once: each lasting one is armed, each quick one is not.
        lasting = [Client() for _ in range(20)]
        quick = [Client() for _ in range(20)]
        results = []

        async def one(client, seconds):
            async def work(_watcher):
                await trio.sleep(seconds)

            results.append(await _handle(clients, client, work))

        async with trio.open_nursery() as requests:
            for client in lasting:
                requests.start_soon(one, client, 1)
            for client in quick:
                requests.start_soon(one, client, GRACE / 4)
        assert all(client.calls == 1 for client in lasting)
        assert all(client.calls == 0 for client in quick)
        assert all(finished and not left for finished, left, _ in results)
        clients.stop()
    assert not clients.running
