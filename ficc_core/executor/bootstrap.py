"""From a started engine to "ready": the readiness probe, then the job's bootstrap requests.

The executor probes ``GET <readiness.path>`` every ``interval`` seconds until it
answers 200, at most ``timeout`` seconds (:func:`probe_until_ready`).

Some engines start empty and are handed their model through their own API
(Ollama: upload the weights to ``/api/blobs/sha256:<digest>``, then ``/api/create``).
A job lists those requests in :attr:`~ficc_core.Job.bootstrap`; the executor sends
them, in order, once the readiness probe passes. Only the executor sends them,
and only the job's admitted inputs can be streamed as a body, so no client ever
chooses which host file reaches an engine. The first request that fails, times
out or answers a status outside its ``expect`` list fails the attempt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ..http1.engine_codec import EngineProtocolError
from .errors import EngineUnavailable, ExecutorError

if TYPE_CHECKING:
    from ..schema import BootstrapRequest, Job
    from .endpoint import EndpointStreams

__all__ = ["BootstrapFailed", "probe_until_ready", "run_bootstrap"]

#: How much of a refusing answer's body goes into the failure message.
_ANSWER_SHOWN = 300


class BootstrapFailed(ExecutorError):
    """A bootstrap request failed; the message names the request and what happened."""

    status = 502
    code = "bootstrap_failed"


def describe(index: int, request: BootstrapRequest) -> str:
    """``bootstrap request 2 (POST /api/create)``, for messages."""
    return f"bootstrap request {index + 1} ({request.method} {request.path})"


async def run_bootstrap(
    streams: EndpointStreams, attempt_id: str, requests: tuple[BootstrapRequest, ...]
) -> None:
    """Send ``requests`` to the attempt's engine in order; raise :class:`BootstrapFailed`."""
    for index, request in enumerate(requests):
        what = describe(index, request)
        body = b""
        content_type = None
        if request.body is not None:
            body = json.dumps(request.body, separators=(",", ":")).encode()
            content_type = "application/json"
        status, answer = 0, b""
        with trio.move_on_after(request.timeout) as scope:
            try:
                status, answer = await streams.request(
                    attempt_id,
                    request.method,
                    request.path,
                    body=body,
                    content_type=content_type,
                    input_id=request.input_id,
                    limit=4096,
                )
            except (ExecutorError, OSError, trio.BrokenResourceError, EngineProtocolError) as exc:
                raise BootstrapFailed(
                    f"{what} failed: {exc}", details=_details(index, request)
                ) from None
        if scope.cancelled_caught:
            raise BootstrapFailed(
                f"{what} did not answer within {request.timeout:g} s",
                details=_details(index, request),
            )
        if status not in request.expect:
            shown = answer[:_ANSWER_SHOWN].decode("utf-8", "replace").strip()
            expected = ", ".join(str(code) for code in request.expect)
            raise BootstrapFailed(
                f"{what} answered {status}, expected {expected}" + (f": {shown}" if shown else ""),
                details={**_details(index, request), "status": status},
            )


def _details(index: int, request: BootstrapRequest) -> dict[str, object]:
    return {"index": index, "method": request.method, "path": request.path}


def _no_answer(exc: BaseException) -> str:
    """What kept the probe from an HTTP answer, in a few words."""
    cause = exc.__context__ if isinstance(exc, EngineUnavailable) else exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, FileNotFoundError):
        return "no socket yet"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    if isinstance(cause, EngineProtocolError):
        return "not an HTTP answer"
    return "connection failed"


#: The first readiness probe's wait, and how much longer each next one waits (up to the
#: probe's interval). Each wait is then about a tenth of the time since the first probe,
#: so an engine is seen ready about 5 % of its load time late (at most about 10 %, and
#: never more than the interval): a tenth, not a quarter, saves an on-demand cold start
#: of 2 s about 0.15 s for a dozen more probes of a few tens of microseconds each.
FIRST_PROBE = 0.02
PROBE_GROWTH = 1.1


async def probe_until_ready(
    streams: EndpointStreams,
    attempt_id: str,
    job: Job,
    answered: Callable[[str], None] = lambda _health: None,
) -> tuple[str, str] | None:
    """Probe the engine until it is ready, then bootstrap it; None, or (reason, message).

    The reason is ``readiness_timeout`` or ``bootstrap_failed``; the message says
    the engine was stopped, which the caller then does. ``answered`` is told each
    probe's answer: the HTTP status (``"200"``), or why there was none
    (``"connection refused"``, ``"no answer"``).
    """
    probe = job.readiness
    status = 0
    # The first probes come sooner than the interval, then ever less soon up to it: a
    # small model ready in half a second is seen within a few tens of milliseconds
    # (an idle on-demand service's cold start waits on this), and an engine loading
    # for minutes is asked no more often than its adapter said.
    delay = min(FIRST_PROBE, probe.interval)
    with trio.move_on_after(probe.timeout):
        while True:
            health = "no answer"
            with trio.move_on_after(max(probe.interval, 2.0)):
                try:
                    status, _ = await streams.request(attempt_id, "GET", probe.path)
                    health = str(status)
                except (
                    EngineUnavailable,
                    OSError,
                    trio.BrokenResourceError,
                    EngineProtocolError,
                ) as exc:
                    status, health = 0, _no_answer(exc)
            answered(health)
            if status == 200:
                break
            await trio.sleep(delay)
            delay = min(delay * PROBE_GROWTH, probe.interval)
    if status != 200:
        return (
            "readiness_timeout",
            f"the engine did not answer 200 on {probe.path} within {probe.timeout:g} s; "
            "it was stopped",
        )
    if job.bootstrap:
        try:
            await run_bootstrap(streams, attempt_id, job.bootstrap)
        except BootstrapFailed as exc:
            return "bootstrap_failed", f"{exc.message}; it was stopped"
    return None
