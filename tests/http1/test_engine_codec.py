"""The endpoint action's HTTP/1.1 framing: requests written, engine responses parsed by llhttp.

h11 (still the registry's and the test servers' HTTP library) is the reference: a
response it produces must come out of :class:`ResponseParser` as the same status,
headers and body, however the bytes are split into reads.
"""

from __future__ import annotations

import gc
import itertools

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ficc_core.executor.types import BodyChunk, EndOfStream, ResponseHead
from ficc_core.http1.engine_codec import (
    EngineClosedEarly,
    EngineProtocolError,
    ResponseParser,
    encode_request,
)


def parse(*reads: bytes) -> tuple[ResponseParser, list[object]]:
    parser = ResponseParser()
    events: list[object] = []
    for data in reads:
        events += parser.feed(data)
    return parser, events


def body_of(events: list[object]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, BodyChunk))


def test_a_content_length_answer_gives_head_body_end_and_the_connection_may_be_reused() -> None:
    parser, events = parse(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
        b'Keep-Alive: timeout=5\r\n\r\n{"a":1}'
    )
    head = events[0]
    assert head == ResponseHead(status=200, headers=(("content-type", "application/json"),))
    assert body_of(events) == b'{"a":1}' and events[-1] == EndOfStream()
    assert parser.complete and parser.keep_alive


def test_chunked_sse_split_at_every_byte_arrives_whole_and_in_order() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        b'f\r\ndata: {"n":1}\n\n\r\nf\r\ndata: {"n":2}\n\n\r\n0\r\n\r\n'
    )
    parser, events = parse(*(wire[i : i + 1] for i in range(len(wire))))
    assert isinstance(events[0], ResponseHead) and events[0].status == 200
    assert dict(events[0].headers) == {"content-type": "text/event-stream"}
    assert body_of(events) == b'data: {"n":1}\n\ndata: {"n":2}\n\n'
    assert events.count(EndOfStream()) == 1 and events[-1] == EndOfStream()
    assert parser.keep_alive


def test_an_answer_until_close_ends_at_the_close_and_is_not_reused() -> None:
    parser, events = parse(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello ", b"world")
    assert not parser.complete and events[-1] == BodyChunk(b"world")
    assert parser.feed(b"") == [EndOfStream()]
    assert parser.complete and not parser.keep_alive


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"HTTP/1.1 200 OK\r\ncontent-len",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nabc",
    ],
)
def test_a_close_before_the_answer_is_complete_is_an_error(wire: bytes) -> None:
    parser = ResponseParser()
    if wire:
        parser.feed(wire)
    with pytest.raises(EngineClosedEarly):
        parser.feed(b"")
    assert not parser.complete


@pytest.mark.parametrize(
    "wire",
    [
        b"SSH-2.0-OpenSSH_9.2\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
    ],
)
def test_what_is_not_http_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(EngineProtocolError):
        parse(wire)


def test_an_interim_answer_is_skipped_and_the_real_one_relayed() -> None:
    parser, events = parse(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"
    )
    assert [type(e) for e in events] == [ResponseHead, BodyChunk, EndOfStream]
    assert events[0].status == 201 and parser.keep_alive


def test_an_upgrade_is_refused() -> None:
    with pytest.raises(EngineProtocolError, match="switched protocols"):
        parse(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
        )


@pytest.mark.parametrize(
    ("wire", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
        # Bytes after the answer (a second answer nobody asked for, or junk).
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nHTTP/1.1 200 OK\r\n", False),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n\x00\x01junk", False),
    ],
)
def test_a_connection_is_reused_only_when_http_says_it_may_be(wire: bytes, reusable: bool) -> None:
    parser, events = parse(wire)
    assert parser.complete and events[-1] == EndOfStream()
    assert parser.keep_alive is reusable


def test_bytes_in_a_later_read_after_the_answer_stop_the_reuse() -> None:
    parser, _ = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert parser.keep_alive
    assert parser.feed(b"x") == [] and not parser.keep_alive


@pytest.mark.parametrize(
    "reads",
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n", b"0\r\n\r\n"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nHTTP/1.1 junk", b"more"),
        (b"HTTP/1.1 200 OK\r\n\r\nuntil close", b""),
    ],
    ids=["content-length", "chunked", "junk-after", "until-close"],
)
def test_a_finished_answer_leaves_no_garbage_for_the_cyclic_collector(
    reads: tuple[bytes, ...],
) -> None:
    # llhttp holds the parser's callbacks; a parser kept past the answer made a cycle
    # per relayed request, which only the cyclic collector could free.
    gc.collect()
    gc.disable()
    try:
        parser, events = parse(*reads)
        assert parser.complete and events[-1] == EndOfStream()
        del parser, events
        assert gc.collect() == 0
    finally:
        gc.enable()


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)


@settings(max_examples=150, deadline=None)
@given(
    status=st.sampled_from([200, 201, 400, 404, 422, 500, 503]),
    headers=st.lists(st.tuples(_TOKEN, _VALUE), max_size=6),
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=5),
    chunked=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_any_answer_h11_writes_parses_to_the_same_status_headers_and_body(
    status: int,
    headers: list[tuple[str, str]],
    chunks: list[bytes],
    chunked: bool,
    cuts: list[int],
) -> None:
    headers = [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]
    server = h11.Connection(h11.SERVER)
    server.receive_data(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-length: 0\r\n\r\n"
    )
    assert isinstance(server.next_event(), h11.Request)
    framing = (
        [("transfer-encoding", "chunked")]
        if chunked
        else [("content-length", str(sum(map(len, chunks))))]
    )
    wire = server.send(h11.Response(status_code=status, headers=[*headers, *framing])) or b""
    for chunk in chunks:
        wire += server.send(h11.Data(data=chunk)) or b""
    wire += server.send(h11.EndOfMessage()) or b""
    bounds = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    parser, events = parse(*(wire[a:b] for a, b in itertools.pairwise(bounds)))
    head = events[0]
    assert isinstance(head, ResponseHead) and head.status == status
    assert list(head.headers) == [
        (n.lower(), v)
        for n, v in headers
        if n.lower() != "connection" and n.lower() not in ("keep-alive", "te", "trailer", "upgrade")
    ]
    assert body_of(events) == b"".join(chunks)
    assert events[-1] == EndOfStream() and parser.complete


def test_a_request_head_is_what_h11_reads_back() -> None:
    wire = encode_request(
        "POST",
        "/v1/chat/completions?x=1",
        [("content-type", "application/json"), ("x-request-id", "abc")],
        2,
        keep_alive=True,
    )
    server = h11.Connection(h11.SERVER)
    server.receive_data(wire + b"{}")
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (b"POST", b"/v1/chat/completions?x=1")
    assert dict(request.headers) == {
        b"host": b"engine",
        b"content-length": b"2",
        b"content-type": b"application/json",
        b"x-request-id": b"abc",
    }
    assert server.next_event() == h11.Data(data=b"{}")
    closing = encode_request("GET", "/health", [], 0, keep_alive=False)
    assert b"\r\nconnection: close\r\n" in closing


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/v1/chat HTTP/1.1\r\nhost: evil\r\n\r\nGET /", []),
        ("/v1/chat completions", []),
        ("http://elsewhere/v1", []),
        ("/v1/chat", [("x-a", "1\r\nx-injected: 2")]),
        ("/v1/chat", [("x-a\nb", "1")]),
        ("/v1/chat", [("x-a", "nul\0")]),
        ("/v1/chat", [("x-a", "snow \u2603")]),
    ],
)
def test_a_request_that_could_be_split_or_smuggled_is_refused(
    target: str, headers: list[tuple[str, str]]
) -> None:
    with pytest.raises(EngineProtocolError):
        encode_request("POST", target, headers, 0, keep_alive=True)
