"""One HTTP/1.1 request over TLS on a blocking socket, for outbound fetches in worker threads.

:mod:`ficc_core.models.fetch` decides what may be fetched and follows redirects;
this module only carries one ``GET`` and its response. It connects to addresses
it is given (the ones the caller checked, never a name it resolves again),
verifies the certificate for the URL's host, and reads the response head with
h11. A body framed by ``Content-Length`` is then read straight into the
caller's buffer (``readinto``), without h11 or an intermediate copy: TLS records
are decrypted into the buffer the caller hashes and writes. Other framings
(chunked, until close) go through h11.

A connection belongs to one worker thread at a time. :meth:`Http1Connection.abort`
may be called from any thread: it shuts the socket down, so a blocked connect,
handshake, read or write returns at once and raises ``FetchError`` ``aborted``.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Sequence
from typing import Any

import h11

from ..base.errors import FiccError

#: What one read from h11 or the socket asks for when the caller does not say.
CHUNK = 64 * 1024

#: (family, sockaddr) pairs, as ``getaddrinfo`` gives them.
Address = tuple[int, Any]


class FetchError(FiccError):
    """An outbound request was refused or failed; ``code`` says which way."""

    status = 502
    code = "fetch_failed"


class Http1Connection:
    """One ``GET`` and its response; see the module docstring.

    :param host: the URL's host, ASCII (IDNA) form: the certificate must name it.
    """

    def __init__(self, host: str, *, connect_timeout: float, read_timeout: float) -> None:
        self.host = host
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False
        self._h11 = h11.Connection(h11.CLIENT)
        #: Body bytes left when the body is read directly (Content-Length framing).
        self._remaining: int | None = None
        #: The response's Content-Length, when the body is read directly.
        self._declared = 0
        #: Bytes received with the head or from h11 but not yet handed out.
        self._pending = memoryview(b"")
        self._ended = False
        #: The setting whose timeout applies now, for messages.
        self._timeout_setting = "connect_timeout"

    # -- any thread -------------------------------------------------------------

    def abort(self) -> None:
        """Make whatever this connection is blocked in return now, and every later call fail."""
        with self._lock:
            self._aborted = True
            sock = self._sock
        if sock is not None:
            try:
                # The plain socket's shutdown: SSLSocket's own would drop its TLS state
                # while the reading thread may still be inside it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Close the socket (no TLS close_notify: nothing more is read from it)."""
        with self._lock:
            self._aborted = True
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # -- the owning thread ------------------------------------------------------

    def connect(self, context: ssl.SSLContext, port: int, addresses: Sequence[Address]) -> None:
        """Connect to the first of ``addresses`` that answers, then complete the TLS handshake.

        ``context`` verifies the server's certificate for :attr:`host`.
        """
        failures, timed_out = [], False
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            self._adopt(sock)
            try:
                sock.settimeout(self._connect_timeout)
                sock.connect(sockaddr)
            except TimeoutError:
                timed_out = True
                failures.append(f"{sockaddr[0]}: no answer within {self._connect_timeout:g} s")
            except OSError as exc:
                failures.append(f"{sockaddr[0]}: {exc.strerror or exc}")
            else:
                break
            sock.close()
            self._check_aborted()
        else:
            code = "fetch_timeout" if timed_out else "fetch_failed"
            raise FetchError(
                f"cannot connect to {self.host} port {port} ({'; '.join(failures)})",
                code=code,
                details={"host": self.host, "port": port},
            )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = context.wrap_socket(
                sock, server_hostname=self.host, do_handshake_on_connect=False
            )
            self._adopt(tls)
            tls.do_handshake()
        except ssl.SSLCertVerificationError as exc:
            raise FetchError(
                f"the certificate of {self.host} was refused: {exc.verify_message}",
                code="certificate_refused",
                details={"host": self.host, "verify_message": exc.verify_message},
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise self._failure(exc, "the TLS handshake with", code="fetch_failed") from None
        tls.settimeout(self._read_timeout)
        self._timeout_setting = "read_timeout"

    def request(
        self, target: bytes, netloc: bytes, headers: Sequence[tuple[str, str]]
    ) -> h11.Response:
        """Send ``GET target`` and return the response head; the body is read after it."""
        request = h11.Request(
            method="GET",
            target=target,
            # In bytes, as h11 would encode them (ASCII): its types want one or the other.
            headers=[
                (b"Host", netloc),
                *((name.encode("ascii"), value.encode("ascii")) for name, value in headers),
                (b"Connection", b"close"),
            ],
        )
        self._sendall(self._h11.send(request) + self._h11.send(h11.EndOfMessage()))
        while True:
            event = self._next_event("the response head from")
            if isinstance(event, h11.Response):
                break
            if isinstance(event, h11.ConnectionClosed):
                raise FetchError(
                    f"{self.host} closed the connection without answering", code="fetch_failed"
                )
            # InformationalResponse (1xx): the real answer follows.
        framing = {name: value for name, value in event.headers}
        if b"transfer-encoding" not in framing and b"content-length" in framing:
            # h11 checked it is one well-formed integer; the body bypasses h11 from here.
            self._remaining = self._declared = int(framing[b"content-length"])
            leftover = self._h11.trailing_data[0][: self._remaining]
            self._pending = memoryview(leftover)
        return event

    def readinto(self, view: memoryview) -> int:
        """Read body bytes into ``view``; return how many (0: the body has ended).

        :raises FetchError: ``fetch_timeout`` (nothing for ``read_timeout``),
            ``body_truncated`` (the server closed the connection before the end of the
            body its ``Content-Length`` declared), ``connection_dropped`` (the connection
            broke, or a body of another framing was cut short) or ``aborted``.
        """
        if not len(view):
            return 0
        if self._pending:
            count = min(len(view), len(self._pending))
            view[:count] = self._pending[:count]
            self._pending = self._pending[count:]
            if self._remaining is not None:
                self._remaining -= count
            return count
        if self._remaining is not None:
            if not self._remaining:
                return 0
            count = self._recv_into(view[: self._remaining])
            if not count:
                raise self._truncated()
            self._remaining -= count
            return count
        while not self._ended:
            event = self._next_event("the body from")
            if isinstance(event, h11.Data):
                self._pending = memoryview(event.data)
                return self.readinto(view)
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self._ended = True
        return 0

    def fill(self, view: memoryview) -> tuple[int, FetchError | None]:
        """Read body bytes until ``view`` is full or the body ends.

        Returns how many were read and, if a failure stopped the read early, that
        failure (as :meth:`readinto` raises it): what arrived before it is in
        ``view`` either way. A ``Content-Length`` body is read here in a tight loop,
        one ``recv_into`` per TLS record, holding the GIL as little as possible.
        """
        filled = 0
        if self._pending or self._remaining is None:
            try:
                while filled < len(view):
                    count = self.readinto(view[filled:])
                    if not count:
                        break
                    filled += count
            except FetchError as exc:
                return filled, exc
            return filled, None
        want = min(len(view), self._remaining)
        sock = self._sock
        if sock is None:
            return 0, FetchError("the request was abandoned", code="aborted")
        recv_into = sock.recv_into
        error = None
        try:
            while filled < want:
                count = recv_into(view[filled:want])
                if not count:
                    break
                filled += count
        except (OSError, ssl.SSLError) as exc:
            error = self._failure(exc, "reading from", code="connection_dropped")
        self._remaining -= filled
        if error is None and filled < want:
            error = (
                FetchError("the request was abandoned", code="aborted")
                if self._aborted
                else self._truncated()
            )
        return filled, error

    def read(self, limit: int = CHUNK) -> bytes:
        """Return up to ``limit`` body bytes (empty at the end of the body)."""
        buffer = bytearray(limit)
        return bytes(buffer[: self.readinto(memoryview(buffer))])

    # -- internals --------------------------------------------------------------

    def _adopt(self, sock: socket.socket) -> None:
        with self._lock:
            if self._aborted:
                sock.close()
                raise FetchError("the request was abandoned", code="aborted")
            self._sock = sock

    def _check_aborted(self) -> None:
        if self._aborted:
            raise FetchError("the request was abandoned", code="aborted")

    def _truncated(self) -> FetchError:
        """The server ended the connection before the body its Content-Length declared."""
        remaining = self._remaining or 0
        received = self._declared - remaining
        return FetchError(
            f"{self.host} closed the connection after {received:,} of the {self._declared:,}"
            f" body bytes its Content-Length declared ({remaining:,} missing)",
            code="body_truncated",
            details={
                "host": self.host,
                "received": received,
                "declared": self._declared,
                "missing": remaining,
            },
        )

    def _failure(self, exc: BaseException, what: str, *, code: str) -> FetchError:
        if self._aborted:
            return FetchError("the request was abandoned", code="aborted")
        if isinstance(exc, TimeoutError):
            return FetchError(
                f"{what} {self.host} timed out ({self._timeout_setting})",
                code="fetch_timeout",
                details={"host": self.host},
            )
        return FetchError(f"{what} {self.host} failed: {exc}", code=code)

    def _sendall(self, data: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except (OSError, ssl.SSLError) as exc:
            raise self._failure(exc, "sending the request to", code="fetch_failed") from None

    def _recv_into(self, view: memoryview) -> int:
        sock = self._sock
        if sock is None:
            raise FetchError("the request was abandoned", code="aborted")
        try:
            count = sock.recv_into(view)
        except (OSError, ssl.SSLError) as exc:
            raise self._failure(exc, "reading from", code="connection_dropped") from None
        # A socket shut down by abort() reads as closed: that is not the server's doing.
        self._check_aborted()
        return count

    def _next_event(self, what: str) -> Any:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise FetchError(
                    f"{what} {self.host} is not valid HTTP/1.1: {exc}",
                    code="connection_dropped" if "body" in what else "fetch_failed",
                ) from None
            if event is not h11.NEED_DATA:
                return event
            buffer = bytearray(CHUNK)
            count = self._recv_into(memoryview(buffer))
            self._h11.receive_data(bytes(buffer[:count]))
