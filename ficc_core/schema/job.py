"""The job an engine adapter returns, and the fence every endpoint operation carries.

An adapter translates a specification into a :class:`Job`: the engine's argv and
environment, the read-only inputs it may see, the :class:`EndpointContract` the
executor exposes, a :class:`ReadinessProbe` and the engine's capabilities. The
executor owns the process, its limits and its socket; the job only describes them.
"""

import json
import re
from typing import Any, Literal

import attrs

from ._convert import MAX_SAFE_INTEGER, FieldError, integer, number
from ._convert import digest as _digest
from .spec import (
    IDENTIFIER_PATTERN,
    MAX_SECONDS,
    NODE_ID_PATTERN,
    _as_dict,
    _as_sorted_set,
    _as_tuple,
    _digest_string,
    _items,
    _matches,
    _one_of,
    _optional,
    _shown,
    _text,
)

ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSAFE_IN_PATH = re.compile(r"[\x00-\x20\x7f?#\\]")

#: How the executor exposes the engine: a Unix socket in the attempt directory, or TCP.
Transport = Literal["unix", "tcp"]


def _check_request_path(field: str, path: Any) -> None:
    if not isinstance(path, str) or not path.startswith("/"):
        raise FieldError(field, f'must be a request path starting with "/", got {_shown(path)}')
    if _UNSAFE_IN_PATH.search(path) or len(path) > 1024:
        raise FieldError(
            field, f"must be a plain path without spaces, query or fragment, got {_shown(path)}"
        )
    if any(segment in (".", "..") for segment in path.split("/")):
        raise FieldError(field, f'must not contain "." or ".." segments, got {_shown(path)}')


def _request_path(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _check_request_path(attribute.name, value)


def _request_paths(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    for index, path in enumerate(value):
        _check_request_path(f"{attribute.name}[{index}]", path)


def _absolute_path(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    def refuse(reason: str) -> None:
        raise FieldError(attribute.name, f"{reason}, got {_shown(value)}")

    if not isinstance(value, str) or not value.startswith("/") or value == "/":
        refuse("must be an absolute path below /")
    if re.search(r"[\x00-\x1f\x7f\\]", value):
        refuse("must not contain control characters or backslashes")
    if any(segment in ("", ".", "..") for segment in value[1:].split("/")):
        refuse('must not have empty, "." or ".." segments')


@attrs.frozen(kw_only=True)
class Fence:
    """Identifies the one attempt an endpoint operation (open, read, cancel) belongs to.

    An executor refuses an operation whose fence does not match the attempt it runs,
    so a stale controller or gateway cannot reach a newer generation's engine.

    :ivar attempt_id: the attempt the executor started.
    :ivar generation: the service generation of that attempt (1 or more).
    :ivar plan_digest: the workload's plan digest, ``sha256:<hex>``.
    """

    attempt_id: str = attrs.field(validator=_text(128))
    generation: int = integer(1, MAX_SAFE_INTEGER)
    plan_digest: str = attrs.field(validator=_digest_string)


def _socket_name(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _text(100)(_instance, attribute, value)
    if "/" in value or value in (".", ".."):
        raise FieldError(
            attribute.name,
            f"must be a file name inside the attempt directory, not a path, got {_shown(value)}",
        )


def _port_matches_transport(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if instance.transport == "tcp" and value is None:
        raise FieldError(attribute.name, 'is required when transport is "tcp"')
    if instance.transport == "unix" and value is not None:
        raise FieldError(attribute.name, 'must be left out when transport is "unix"')


@attrs.frozen(kw_only=True)
class EndpointContract:
    """How the executor exposes an engine, and the only request paths it lets through.

    :ivar transport: ``"unix"`` (default) or ``"tcp"``.
    :ivar socket: for ``unix``, the socket's file name inside the attempt directory
        (default ``"engine.sock"``); the executor creates the directory.
    :ivar port: for ``tcp`` only, the loopback port (1 to 65535).
    :ivar paths: the request paths the executor admits, each starting with ``/``;
        stored sorted and without duplicates, so equal sets give equal digests.
    :ivar version: the endpoint contract version; only ``1`` exists.
    """

    paths: tuple[str, ...] = attrs.field(
        converter=_as_sorted_set,
        validator=[_items(str, non_empty=True, noun="request path"), _request_paths],
    )
    transport: Transport = attrs.field(default="unix", validator=_one_of("unix", "tcp"))
    socket: str = attrs.field(default="engine.sock", validator=_socket_name)
    port: int | None = integer(1, 65535, default=None, validator=_port_matches_transport)
    version: int = integer(1, 1, default=1)

    @classmethod
    def unix(
        cls, paths: "tuple[str, ...] | list[str]", *, socket: str = "engine.sock"
    ) -> "EndpointContract":
        """An engine listening on a Unix socket in its attempt directory."""
        return cls(paths=paths, transport="unix", socket=socket)

    @classmethod
    def tcp(cls, port: int, paths: "tuple[str, ...] | list[str]") -> "EndpointContract":
        """An engine listening on a loopback TCP port (for engines without Unix sockets)."""
        return cls(paths=paths, transport="tcp", port=port)

    def admits(self, path: str) -> bool:
        """Whether a request for ``path`` may pass through the executor."""
        return path in self.paths


def _interval_within_timeout(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value > instance.timeout:
        raise FieldError(
            attribute.name, f"must not exceed the timeout ({instance.timeout:g} s), got {value:g}"
        )


@attrs.frozen(kw_only=True)
class ReadinessProbe:
    """How the executor decides the engine has started.

    :ivar path: the request path that answers 200 once the engine is ready.
    :ivar timeout: seconds start-up may take before the attempt fails (more than 0).
    :ivar interval: the most seconds between probes (more than 0, at most ``timeout``);
        the executor probes sooner at first (from 20 ms, a tenth longer each time), so
        an engine that loads fast is seen ready at once.
    """

    path: str = attrs.field(default="/health", validator=_request_path)
    timeout: float = number(0, MAX_SECONDS, above=True, default=600.0)
    interval: float = number(
        0, MAX_SECONDS, above=True, default=0.5, validator=_interval_within_timeout
    )


@attrs.frozen(kw_only=True)
class JobInput:
    """A read-only file or directory the executor admits into the engine's sandbox.

    :ivar id: the input's ID; only admitted IDs may feed an engine's blob upload route.
    :ivar path: the absolute host path of the file or directory.
    :ivar digest: ``sha256:<hex>`` of its content, when it is a single verified file.
    """

    id: str = attrs.field(
        validator=_matches(
            NODE_ID_PATTERN,
            'an input ID: a letter or digit, then up to 62 letters, digits, ".", "_" or "-"',
        )
    )
    path: str = attrs.field(validator=_absolute_path)
    digest: str | None = attrs.field(default=None, validator=_optional(_digest_string))


#: The largest JSON body a bootstrap request may carry, in bytes of canonical JSON.
MAX_BOOTSTRAP_BODY = 64 * 1024


def _json_body(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict | list):
        raise FieldError(attribute.name, f"must be a JSON object or array, got {_shown(value)}")
    try:
        encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise FieldError(attribute.name, f"must be plain JSON: {exc}") from None
    if len(encoded) > MAX_BOOTSTRAP_BODY:
        raise FieldError(
            attribute.name, f"has {len(encoded)} bytes of JSON; at most {MAX_BOOTSTRAP_BODY}"
        )


def _statuses(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _items(int, non_empty=True, noun="status code")(_instance, attribute, value)
    for index, status in enumerate(value):
        if isinstance(status, bool) or not 200 <= status <= 299:
            raise FieldError(
                f"{attribute.name}[{index}]",
                f"must be a success status (200 to 299), got {_shown(status)}",
            )


def _one_body(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    _matches(NODE_ID_PATTERN, "an input ID")(instance, attribute, value)
    if instance.body is not None:
        raise FieldError(attribute.name, "and body are exclusive: the input is the body")
    if instance.method != "POST":
        raise FieldError(attribute.name, "is uploaded with POST only")


@attrs.frozen(kw_only=True)
class BootstrapRequest:
    """One request the executor sends after readiness and before it reports the attempt ready.

    Engines such as Ollama start empty and are given their model through their own
    API; a job lists those requests, in order, in :attr:`Job.bootstrap`. The
    executor sends each one to the engine (never the gateway), and a status outside
    ``expect`` fails the attempt.

    :ivar path: the request path; the job's endpoint contract must admit it.
    :ivar method: ``"POST"`` (default) or ``"GET"``.
    :ivar body: a JSON object or array sent as ``application/json``; absent for none.
    :ivar input_id: an admitted input of the job whose *file* the executor streams as
        the body (``application/octet-stream``): the only way an input reaches an
        engine's native blob upload route. Exclusive with ``body``; POST only.
    :ivar expect: the success statuses that let the bootstrap go on (default ``200``).
    :ivar timeout: seconds the request may take, upload included (default 600).
    """

    path: str = attrs.field(validator=_request_path)
    method: Literal["GET", "POST"] = attrs.field(default="POST", validator=_one_of("GET", "POST"))
    body: Any = attrs.field(default=None, validator=_json_body, hash=False)
    input_id: str | None = attrs.field(default=None, validator=_one_body)
    expect: tuple[int, ...] = attrs.field(default=(200,), converter=_as_tuple, validator=_statuses)
    timeout: float = number(0, MAX_SECONDS, above=True, default=600.0)


def _as_bootstrap(value: Any) -> tuple[BootstrapRequest, ...] | None:
    # Absent and empty are the same: None is left out of the canonical JSON, so a
    # job without bootstrap requests keeps the digest it had before they existed.
    if value is None:
        return None
    value = _as_tuple(value)
    return value or None


def _bootstrap(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    _items(BootstrapRequest)(instance, attribute, value)
    inputs = {item.id for item in instance.inputs}
    for index, request in enumerate(value):
        if not instance.endpoint.admits(request.path):
            raise FieldError(
                f"{attribute.name}[{index}].path",
                f"{_shown(request.path)} is not admitted by the job's endpoint contract",
            )
        if request.input_id is not None and request.input_id not in inputs:
            raise FieldError(
                f"{attribute.name}[{index}].input_id",
                f"{_shown(request.input_id)} is not one of the job's inputs",
            )


def _env(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    for name, setting in value.items():
        if not isinstance(name, str) or not ENV_NAME_PATTERN.fullmatch(name):
            raise FieldError(
                f"{attribute.name}[{name!r}]",
                "is not an environment variable name: use letters, digits and _, "
                "not starting with a digit",
            )
        if not isinstance(setting, str) or "\x00" in setting:
            raise FieldError(f"{attribute.name}[{name!r}]", "must be a string without NUL")


def _argv(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _items(str, non_empty=True, noun="argument, the executable")(_instance, attribute, value)
    if not value[0]:
        raise FieldError(f"{attribute.name}[0]", "must name the executable, not be empty")
    for index, argument in enumerate(value):
        if "\x00" in argument:
            raise FieldError(f"{attribute.name}[{index}]", "must not contain NUL")


def _distinct_inputs(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _items(JobInput)(_instance, attribute, value)
    seen: set[str] = set()
    for index, item in enumerate(value):
        if item.id in seen:
            raise FieldError(
                f"{attribute.name}[{index}].id", f"repeats {_shown(item.id)}; IDs must be unique"
            )
        seen.add(item.id)


def _capabilities(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    for index, name in enumerate(value):
        if not IDENTIFIER_PATTERN.fullmatch(name):
            raise FieldError(
                f"{attribute.name}[{index}]",
                f'must be a lowercase capability name such as "chat", got {_shown(name)}',
            )


@attrs.frozen(kw_only=True)
class Job:
    """What an engine adapter asks an executor to run for one replica.

    :ivar argv: the engine command line; ``argv[0]`` is the executable inside the runtime.
    :ivar env: environment variables for the engine (names of letters, digits and ``_``).
    :ivar inputs: read-only files and directories to admit, each ID once.
    :ivar endpoint: how the executor exposes the engine and which paths it admits.
    :ivar readiness: how the executor knows the engine is up (default ``GET /health``,
        600 s start-up timeout, probing every 0.5 s).
    :ivar capabilities: what the engine serves (``chat``, ``embeddings``, ``streaming``,
        ``tools``, ...); stored sorted and without duplicates.
    :ivar bootstrap: requests the executor sends, in order, once the readiness probe
        passes and before the attempt is reported ready (see :class:`BootstrapRequest`).
        Absent (and left out of the canonical JSON, so digests of jobs without it do
        not change) when the engine needs none; an empty list means absent.
    """

    argv: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_argv)
    endpoint: EndpointContract = attrs.field(
        validator=attrs.validators.instance_of(EndpointContract)
    )
    env: dict[str, str] = attrs.field(factory=dict, converter=_as_dict, validator=_env, hash=False)
    inputs: tuple[JobInput, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=_distinct_inputs
    )
    readiness: ReadinessProbe = attrs.field(
        factory=ReadinessProbe, validator=attrs.validators.instance_of(ReadinessProbe)
    )
    capabilities: tuple[str, ...] = attrs.field(
        default=(), converter=_as_sorted_set, validator=_capabilities
    )
    # Added for bootstrapping engines; None is omitted from the canonical JSON.
    bootstrap: tuple[BootstrapRequest, ...] | None = attrs.field(
        default=None, converter=_as_bootstrap, validator=_bootstrap
    )

    def digest(self) -> str:
        """Return ``sha256:<hex>`` of this job's canonical JSON."""
        return _digest(self)
