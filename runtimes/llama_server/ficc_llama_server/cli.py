"""``ficc-llama-server``: llama.cpp's own HTTP server on a Unix socket, with llama-server flags.

The FICC ``llama_cpp`` adapter writes a real ``llama-server`` command line. This
command accepts exactly the flags that adapter emits, maps them onto
``xllamacpp.CommonParams`` and runs the C++ server the ``xllamacpp`` wheel ships
(the same ``tools/server`` code as ``llama-server``). Any other flag is refused with
exit status 2, so a job never silently runs with an option this runtime ignores.

SIGTERM or SIGINT stops the server: in-flight requests end, the model is freed, the
socket file is removed and the process exits with status 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__

PROG = "ficc-llama-server"

#: llama.cpp's ``common_params.tensor_split`` has one share per possible device.
MAX_DEVICES = 128
#: The host memory (MiB) for idle slots' prompt caches when ``--cache-ram`` is not given:
#: none. llama-server's default, 8192, lets an engine grow by about 30 MiB per distinct
#: 1,400-token prompt of SmolLM2 (measured) past any memory limit that reserves only
#: the weights and the KV cache, as FICC's suggested limits do: the engine is then
#: killed at its limit. Each slot still keeps its own prompt's cache.
HOST_CACHE_MIB = 0

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Parser(argparse.ArgumentParser):
    """argparse that names the one refused flag and keeps the exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _cache_mib(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (no limit), 0 (off) or more, got {value}")
    return value


def _shares(text: str) -> list[float]:
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated numbers such as 3,1, got {text!r}"
        ) from None
    if len(shares) > MAX_DEVICES or any(not share >= 0 for share in shares):
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_DEVICES} shares, each at least 0, got {text!r}"
        )
    return shares


def _socket_path(text: str) -> str:
    # llama-server treats a --host ending in .sock as a Unix socket path; this runtime
    # never listens on TCP, so anything else is refused rather than reinterpreted.
    if not text.endswith(".sock") or "," in text:
        raise argparse.ArgumentTypeError(
            f"{PROG} listens on one Unix socket only: give a path ending in .sock, got {text!r}"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    """The accepted flags: the subset of ``llama-server``'s that the llama_cpp adapter emits."""
    parser = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Run llama.cpp's HTTP server (from xllamacpp) on a Unix socket.",
        epilog="Only these llama-server flags are accepted; any other is refused.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--model", required=True, metavar="FNAME", help="GGUF model to load")
    parser.add_argument(
        "--host",
        required=True,
        type=_socket_path,
        metavar="PATH.sock",
        help="Unix socket path to listen on (must end in .sock)",
    )
    parser.add_argument(
        "--ctx-size",
        type=_non_negative,
        default=0,
        metavar="N",
        help="KV cache size in tokens shared by all slots (0: from the model)",
    )
    parser.add_argument(
        "--parallel",
        type=_positive,
        default=None,
        metavar="N",
        help="number of server slots (default: llama.cpp's automatic choice)",
    )
    parser.add_argument(
        "--threads", type=_positive, default=None, metavar="N", help="CPU threads to use"
    )
    parser.add_argument(
        "--n-gpu-layers", type=_non_negative, default=None, metavar="N", help="layers on GPUs"
    )
    parser.add_argument(
        "--tensor-split", type=_shares, default=None, metavar="N0,N1,...", help="GPU shares"
    )
    parser.add_argument(
        "--alias", default=None, metavar="NAME[,NAME...]", help="model names served to clients"
    )
    parser.add_argument(
        "--embedding",
        "--embeddings",
        dest="embedding",
        action="store_true",
        help="serve /v1/embeddings",
    )
    parser.add_argument(
        "--cache-ram",
        type=_cache_mib,
        default=None,
        metavar="MiB",
        help="host memory for idle slots' prompt caches (0: off, -1: no limit; "
        "default here: 0, where llama-server's is 8192)",
    )
    parser.add_argument("--metrics", action="store_true", help="serve Prometheus /metrics")
    parser.add_argument("--no-webui", action="store_true", help="do not serve the web UI")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``; exit with status 2 naming the first flag this runtime does not accept."""
    parser = build_parser()
    options, unknown = parser.parse_known_args(argv)
    if unknown:
        refused = next((item for item in unknown if item.startswith("-")), unknown[0])
        flag = refused.split("=", 1)[0]
        parser.error(
            f"{flag} is not accepted: {PROG} takes only the llama-server flags the FICC "
            "llama_cpp adapter emits (--model, --host, --ctx-size, --parallel, --threads, "
            "--n-gpu-layers, --tensor-split, --alias, --embedding, --cache-ram, --metrics, "
            "--no-webui)"
        )
    return options


def common_params(options: argparse.Namespace) -> Any:
    """Map parsed flags onto an ``xllamacpp.CommonParams``, as llama-server's parser would."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = options.model
    params.hostnames = [options.host]
    params.n_ctx = options.ctx_size
    if options.parallel is not None:
        params.n_parallel = options.parallel
    else:
        # llama-server's default (-1): llama.cpp picks the slots and unifies the KV cache.
        params.n_parallel = -1
    if options.threads is not None:
        # --threads-batch defaults to --threads in llama-server.
        params.cpuparams.n_threads = options.threads
        params.cpuparams_batch.n_threads = options.threads
    if options.n_gpu_layers is not None:
        params.n_gpu_layers = options.n_gpu_layers
    if options.tensor_split is not None:
        shares = options.tensor_split
        params.tensor_split = shares + [0.0] * (MAX_DEVICES - len(shares))
    if options.alias is not None:
        params.model_alias = {name for name in options.alias.split(",") if name}
    params.embedding = options.embedding
    params.cache_ram_mib = HOST_CACHE_MIB if options.cache_ram is None else options.cache_ram
    params.endpoint_metrics = options.metrics
    params.ui = not options.no_webui
    return params


def _remove_socket(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def _wait_for_main_loop(path: str, timeout: float = 30.0) -> None:
    """Return once llama.cpp's task loop runs, by a request that goes through it.

    The server object returns before its loop thread has entered the task loop, and
    a stop requested in between is lost (the loop marks itself running as it starts),
    so shutting down at once would hang. ``GET /slots`` is answered by that loop.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(timeout)
            client.connect(path)
            client.sendall(b"GET /slots HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n\r\n")
            while client.recv(65536):
                pass
    except OSError as error:
        _log(f"could not confirm that the main loop runs: {error}")


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def serve(options: argparse.Namespace) -> int:
    """Run the server until SIGTERM or SIGINT; return the exit status."""
    import xllamacpp

    params = common_params(options)
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        _log(f"received {signal.Signals(signum).name}, stopping")
        stop.set()

    # A socket left by an earlier run would make the bind fail; only a socket is removed.
    _remove_socket(options.host)
    # Threads llama.cpp starts inherit this mask, so a stop signal is only ever
    # delivered to this (main) thread, where the Python handler below decides.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, request_stop)
        try:
            server = xllamacpp.Server(params)
        except RuntimeError as error:
            # The HTTP server binds before the model loads, so a failed load leaves a socket.
            _remove_socket(options.host)
            _log(f"the server did not start: {error}")
            return 1
        # Starting installed llama.cpp's own SIGINT/SIGTERM handlers; ours take over
        # again so that shutdown happens here, in order, and ends with exit status 0.
        for signum in _STOP_SIGNALS:
            signal.signal(signum, request_stop)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    _log(f"listening on {server.listening_address}")
    try:
        _wait_for_main_loop(options.host)
        stop.wait()
    finally:
        # The destructor stops the HTTP server and the main loop and joins them.
        del server
        _remove_socket(options.host)
    _log("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``ficc-llama-server`` console script."""
    return serve(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
