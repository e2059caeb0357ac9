"""The loopback HTTPS test server does what the fault tests rely on."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from .httpsd import (
    Redirect,
    Request,
    ServedFile,
    ServedJSON,
    client_ssl_context,
    open_https_server,
    write_ca_bundle,
)

DATA = bytes(range(256)) * 1024  # 256 KiB: four 64 KiB pieces


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def client(ca: trustme.CA, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=client_ssl_context(ca), **kwargs)


async def test_serves_a_file_over_verified_tls(ca):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(DATA)}) as server, client(ca) as http:
            response = await http.get(server.url("/f"))
    assert response.status_code == 200
    assert response.content == DATA
    assert response.headers["content-length"] == str(len(DATA))
    assert server.bytes_served["/f"] == len(DATA)
    assert server.requests == [Request("GET", "/f", server.requests[0].headers)]
    assert server.requests[0].headers["host"] == f"127.0.0.1:{server.port}"
    assert server.errors == []


async def test_certificate_names_localhost_and_is_refused_without_the_ca(ca):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(b"x")}) as server:
            async with client(ca) as http:
                by_name = await http.get(f"https://localhost:{server.port}/f")
            async with httpx.AsyncClient() as untrusting:
                with pytest.raises(httpx.ConnectError):
                    await untrusting.get(server.url("/f"))
    assert by_name.content == b"x"


async def test_ca_bundle_file_is_usable_as_a_cafile(ca, tmp_path: Path):
    import ssl

    bundle = write_ca_bundle(tmp_path, ca)
    context = ssl.create_default_context(cafile=str(bundle))
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(b"ok")}) as server:
            async with httpx.AsyncClient(verify=context) as http:
                assert (await http.get(server.url("/f"))).content == b"ok"


async def test_streams_a_file_from_disk(ca, tmp_path: Path):
    path = tmp_path / "blob"
    path.write_bytes(DATA * 8)  # 2 MiB: more than one disk read
    with trio.fail_after(10):
        async with open_https_server(ca, {"/blob": ServedFile(path)}) as server, client(ca) as http:
            response = await http.get(server.url("/blob"))
    assert hashlib.sha256(response.content).digest() == hashlib.sha256(DATA * 8).digest()
    assert server.bytes_served["/blob"] == len(DATA) * 8


@pytest.mark.parametrize(
    ("header", "content_range", "body"),
    [
        ("bytes=1000-", f"bytes 1000-{len(DATA) - 1}/{len(DATA)}", DATA[1000:]),
        ("bytes=10-19", f"bytes 10-19/{len(DATA)}", DATA[10:20]),
        ("bytes=10-999999999", f"bytes 10-{len(DATA) - 1}/{len(DATA)}", DATA[10:]),
        ("bytes=-5", f"bytes {len(DATA) - 5}-{len(DATA) - 1}/{len(DATA)}", DATA[-5:]),
    ],
)
async def test_range_requests_answer_206(ca, header, content_range, body):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(DATA)}) as server, client(ca) as http:
            response = await http.get(server.url("/f"), headers={"Range": header})
    assert response.status_code == 206
    assert response.headers["content-range"] == content_range
    assert response.content == body
    assert server.bytes_served["/f"] == len(body)


async def test_range_past_the_end_answers_416(ca):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(DATA)}) as server, client(ca) as http:
            response = await http.get(server.url("/f"), headers={"Range": f"bytes={len(DATA)}-"})
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{len(DATA)}"
    assert server.bytes_served["/f"] == 0


async def test_ignoring_range_sends_everything_with_200(ca):
    route = ServedFile(DATA, honour_range=False)
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": route}) as server, client(ca) as http:
            response = await http.get(server.url("/f"), headers={"Range": "bytes=100-"})
    assert response.status_code == 200
    assert "content-range" not in response.headers
    assert response.content == DATA


async def test_drop_cuts_the_body_then_the_retry_succeeds(ca):
    route = ServedFile(DATA, drop_after=100_000, drop_times=1)
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": route}) as server, client(ca) as http:
            received = bytearray()
            with pytest.raises(httpx.RemoteProtocolError):
                async with http.stream("GET", server.url("/f")) as response:
                    async for piece in response.aiter_raw():
                        received += piece
            assert bytes(received) == DATA[:100_000]
            retry = await http.get(server.url("/f"), headers={"Range": "bytes=100000-"})
    assert retry.status_code == 206
    assert bytes(received) + retry.content == DATA
    assert route.drops_done == 1
    assert server.bytes_served["/f"] == len(DATA)
    assert server.errors == []


async def test_drop_applies_to_ranged_responses_too(ca):
    route = ServedFile(DATA, drop_after=10, drop_times=2)
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": route}) as server, client(ca) as http:
            for _ in range(2):
                with pytest.raises(httpx.RemoteProtocolError):
                    await http.get(server.url("/f"), headers={"Range": "bytes=5-"})
            third = await http.get(server.url("/f"), headers={"Range": "bytes=5-"})
    assert third.content == DATA[5:]
    assert server.bytes_served["/f"] == 20 + len(DATA) - 5


async def test_redirect_and_redirect_to(ca):
    routes = {
        "/old": Redirect("/new"),
        "/moved": ServedFile(b"", redirect_to="https://elsewhere.invalid/x"),
        "/new": ServedFile(b"here"),
    }
    with trio.fail_after(10):
        async with open_https_server(ca, routes) as server, client(ca) as http:
            first = await http.get(server.url("/old"))
            followed = await http.get(server.url("/old"), follow_redirects=True)
            moved = await http.get(server.url("/moved"))
    assert (first.status_code, first.headers["location"]) == (302, "/new")
    assert followed.content == b"here"
    assert (moved.status_code, moved.headers["location"]) == (302, "https://elsewhere.invalid/x")
    assert [r.path for r in server.requests] == ["/old", "/old", "/new", "/moved"]


async def test_json_routes_handlers_queries_and_404(ca):
    async def handler(request: Request):
        return ServedJSON({"query": request.path.split("?", 1)[1]}, status=201)

    routes = {"/api/a": ServedJSON({"a": 1}), "/api/h": handler}
    with trio.fail_after(10):
        async with open_https_server(ca, routes) as server, client(ca) as http:
            server.add("api/b?exact=1", ServedJSON({"b": 2}))
            a = await http.get(server.url("/api/a?blobs=true"))
            h = await http.get(server.url("/api/h?x=1"))
            b = await http.get(server.url("/api/b?exact=1"))
            missing = await http.get(server.url("/api/b"))
    assert a.json() == {"a": 1}
    assert (h.status_code, h.json()) == (201, {"query": "x=1"})
    assert b.json() == {"b": 2}
    assert missing.status_code == 404
    assert [r.path for r in server.requests_for("/api/a")] == ["/api/a?blobs=true"]


async def test_extra_bytes_make_a_longer_body_with_matching_length(ca):
    route = ServedFile(DATA, extra=b"TRAILING")
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": route}) as server, client(ca) as http:
            whole = await http.get(server.url("/f"))
            tail = await http.get(server.url("/f"), headers={"Range": f"bytes={len(DATA) - 2}-"})
    assert whole.content == DATA + b"TRAILING"
    assert whole.headers["content-length"] == str(len(DATA) + 8)
    assert tail.content == DATA[-2:] + b"TRAILING"


async def test_corrupt_flips_one_byte_in_the_middle(ca):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(DATA, corrupt=True)}) as server:
            async with client(ca) as http:
                whole = await http.get(server.url("/f"))
                tail = await http.get(server.url("/f"), headers={"Range": "bytes=1-"})
    differing = [i for i in range(len(DATA)) if whole.content[i] != DATA[i]]
    assert differing == [len(DATA) // 2]
    assert tail.content == whole.content[1:]


async def test_status_and_header_overrides(ca):
    routes = {
        "/busy": ServedFile(b"try later", status=503, headers={"Retry-After": "1"}),
        "/liar": ServedFile(b"0123456789", headers={"Content-Length": "20"}),
    }
    with trio.fail_after(10):
        async with open_https_server(ca, routes) as server, client(ca) as http:
            busy = await http.get(server.url("/busy"), headers={"Range": "bytes=0-1"})
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(server.url("/liar"))
    assert (busy.status_code, busy.text, busy.headers["retry-after"]) == (503, "try later", "1")


async def test_stall_and_chunk_delay_hit_read_timeouts(ca):
    routes = {"/stall": ServedFile(DATA, stall=True), "/slow": ServedFile(DATA, chunk_delay=5)}
    with trio.fail_after(10):
        async with open_https_server(ca, routes) as server:
            async with client(ca, timeout=httpx.Timeout(5, read=0.3)) as http:
                with pytest.raises(httpx.ReadTimeout):
                    await http.get(server.url("/stall"))
                received = bytearray()
                with pytest.raises(httpx.ReadTimeout):
                    async with http.stream("GET", server.url("/slow")) as response:
                        async for piece in response.aiter_raw():
                            received += piece
    assert len(received) == 64 * 1024
    assert server.bytes_served["/stall"] == 0


async def test_keep_alive_serves_several_requests_on_one_connection(ca):
    with trio.fail_after(10):
        async with open_https_server(ca, {"/f": ServedFile(b"abc")}) as server, client(ca) as http:
            for _ in range(3):
                assert (await http.get(server.url("/f"))).content == b"abc"
    assert len(server.requests) == 3
    assert server.bytes_served["/f"] == 9
