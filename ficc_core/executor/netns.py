"""Connect to an engine's loopback TCP port inside its own network namespace.

An engine that cannot listen on a Unix socket listens on ``127.0.0.1:<port>`` in
its isolated network namespace, where nothing else can reach it. The executor
creates the socket *inside* that namespace (``setns`` in a short-lived thread
that exits afterwards, so no other thread ever changes namespace) and connects
it from the event loop: a socket stays in the namespace it was created in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import threading

import trio

__all__ = ["open_tcp_in_netns"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _socket_in(netns_path: str) -> socket.socket:
    result: list[socket.socket | BaseException] = []

    def create() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                target, own = os.fstat(fd), os.stat("/proc/self/ns/net")
                if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
                    # Never connect in the executor's own namespace: the engine has not
                    # isolated itself yet, and the port there may be someone else's.
                    raise OSError(f"{netns_path} is the executor's own network namespace")
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({netns_path}): {os.strerror(errno)}")
            finally:
                os.close(fd)
            result.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        except BaseException as exc:
            result.append(exc)

    # A fresh thread: it ends in the engine's namespace and then exits.
    thread = threading.Thread(target=create, name="ficc-netns-connect")
    thread.start()
    thread.join()
    [outcome] = result
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


async def open_tcp_in_netns(netns_path: str, port: int) -> trio.SocketStream:
    """Open a TCP connection to ``127.0.0.1:port`` inside the namespace at ``netns_path``."""
    sock = trio.socket.from_stdlib_socket(await trio.to_thread.run_sync(_socket_in, netns_path))
    try:
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)
