"""The adapter conformance kit: checks an engine adapter's own tests call.

In the manner of trio's ``check_one_way_stream``, a third party runs the kit
against its own adapter, with the same factory it passes to ``registry.add``
and a few cases of its choosing::

    from ficc_core.testing import adapter_kit, check_adapter

    def test_my_adapter_conforms():
        check_adapter(MyEngineAdapter, cases=[adapter_kit.make_case("my_engine")])

A case is one call of ``job(specification, model_record, placement,
immutable_input_references)``: an :class:`AdapterCase` or a plain 4-tuple.
For every case the kit asserts that the adapter

- declares ``API_VERSION = 1``;
- returns a ``ficc_core.Job`` while sockets, name resolution, file access and
  process creation are blocked (:func:`io_forbidden`), so it provably does no
  I/O and starts nothing; a blocked call fails the check naming the call, even
  when the adapter swallows the exception;
- is deterministic: repeated calls, and a call on a fresh adapter from the
  factory, give equal jobs with equal ``Job.digest()``;
- declares only admitted inputs (each ``Job.inputs`` entry is one of the
  ``immutable_input_references``, by id, path and digest), and every filesystem
  path in its argv and environment lies inside a declared input;
- declares an endpoint contract that admits at least one path, and a readiness
  probe whose path the contract admits;
- names only known capabilities (:data:`KNOWN_CAPABILITIES`), and its endpoint
  contract admits the route each of them is served on (:data:`CAPABILITY_ROUTES`).

Failures raise :class:`AdapterConformanceError`, an ``AssertionError`` whose
message names the case and the rule broken.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from ..hookspecs import API_VERSION
from ..schema import (
    EndpointContract,
    Job,
    ReadinessProbe,
)
from .adapter_cases import (
    AdapterCase,
    AdapterConformanceError,
    make_case,
    make_placement,
    make_specification,
)
from .io_guard import io_forbidden

__all__ = [
    "CAPABILITY_ROUTES",
    "KNOWN_CAPABILITIES",
    "AdapterCase",
    "AdapterConformanceError",
    "check_adapter",
    "check_api_version",
    "check_capabilities",
    "check_endpoint",
    "check_inputs",
    "check_pure",
    "io_forbidden",
    "make_case",
    "make_placement",
    "make_specification",
]

#: The capabilities a job may declare; the gateway knows what each one means.
KNOWN_CAPABILITIES = frozenset(
    {
        "chat",
        "completions",
        "embeddings",
        "streaming",
        "tools",
        "tokenize.llama_cpp",
        "tokenize.vllm",
    }
)
#: The route the gateway sends a capability's requests to: a job claiming it admits it.
CAPABILITY_ROUTES = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}

AdapterFactory = Callable[[], Any]


_ABSENT: Any = object()


# -- the checks ----------------------------------------------------------------------------


def _fail(case: AdapterCase | None, message: str) -> AdapterConformanceError:
    where = "" if case is None else f"[{case.name}] "
    return AdapterConformanceError(where + message)


def check_api_version(adapter: Any) -> None:
    """The adapter declares ``API_VERSION = 1`` (an int, the version this FICC implements)."""
    value = getattr(adapter, "API_VERSION", _ABSENT)
    if value is _ABSENT:
        raise _fail(None, f"{adapter!r} does not declare API_VERSION; it must be {API_VERSION}")
    if type(value) is not int or value != API_VERSION:
        raise _fail(
            None,
            f"{adapter!r} declares API_VERSION {value!r}; this FICC supports API_VERSION "
            f"{API_VERSION}",
        )
    if not callable(getattr(adapter, "job", None)):
        raise _fail(None, f"{adapter!r} has no callable job()")


def _call_without_io(adapter: Any, case: AdapterCase) -> Job:
    with io_forbidden() as attempted:
        try:
            job = case.call(adapter)
        except AdapterConformanceError as exc:
            raise _fail(case, f"job() did I/O: {exc}") from None
    if attempted:
        raise _fail(
            case,
            f"job() called {', '.join(attempted)} while I/O was forbidden (and swallowed the "
            "error): an adapter must do no I/O and start no processes",
        )
    if not isinstance(job, Job):
        raise _fail(case, f"job() must return a ficc_core.Job, got {type(job).__name__}")
    return job


def check_pure(factory: AdapterFactory, case: AdapterCase) -> Job:
    """``job()`` does no I/O and is deterministic; return the job it made.

    It is called twice on one adapter and once on a fresh adapter from
    ``factory``, each time with I/O blocked; the three jobs and their digests
    must be equal.
    """
    adapter = factory()
    first = _call_without_io(adapter, case)
    again = _call_without_io(adapter, case)
    fresh = _call_without_io(factory(), case)
    for label, other in (("a second call", again), ("a fresh adapter", fresh)):
        if other != first or other.digest() != first.digest():
            raise _fail(
                case,
                f"job() is not deterministic: {label} returned a different job "
                f"({first.digest()} then {other.digest()}); its output may depend only on its "
                f"arguments.\nfirst: {first!r}\nthen:  {other!r}",
            )
    return first


def _inside(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _path_like(text: str) -> list[str]:
    """The parts of an argument or environment value that look like absolute filesystem paths."""
    if "://" in text:  # a URL, not a file
        return []
    value = text.split("=", 1)[1] if text.startswith("-") and "=" in text else text
    found = []
    for piece in value.replace(",", ":").split(":"):
        if piece.startswith("/"):
            found.append(piece)
    return found


def check_inputs(job: Job, case: AdapterCase, *, allowed_paths: Collection[str] = ()) -> None:
    """The job declares only admitted inputs, and its argv and env use only declared ones.

    Every ``Job.inputs`` entry must equal one of the case's
    ``immutable_input_references`` (id, path and digest). Every argv element or
    environment value that looks like an absolute filesystem path must lie in a
    declared input, be a request path the endpoint admits, be ``argv[0]`` when it
    is the specification's ``image_executable``, or be one of ``allowed_paths``
    (fixed paths inside the runtime image, for instance).
    """
    admitted = {reference.id: reference for reference in case.inputs}
    for index, declared in enumerate(job.inputs):
        reference = admitted.get(declared.id)
        if reference is None:
            raise _fail(
                case,
                f"Job.inputs[{index}] declares input {declared.id!r}, which is not one of the "
                f"admitted immutable_input_references ({sorted(admitted) or 'none'})",
            )
        if declared != reference:
            raise _fail(
                case,
                f"Job.inputs[{index}] changes admitted input {declared.id!r}: declared "
                f"{declared!r}, admitted {reference!r}",
            )
    values = [(f"argv[{index}]", arg) for index, arg in enumerate(job.argv)]
    values += [(f"env[{name!r}]", value) for name, value in sorted(job.env.items())]
    for where, value in values:
        if where == "argv[0]" and value == case.specification.image_executable:
            continue
        for path in _path_like(value):
            if any(_inside(path, item.path) for item in job.inputs):
                continue
            if job.endpoint.admits(path) or path in allowed_paths:
                continue
            undeclared = [ref.id for ref in case.inputs if _inside(path, ref.path)]
            if undeclared:
                raise _fail(
                    case,
                    f"{where} = {value!r} uses admitted input {undeclared[0]!r} but Job.inputs "
                    "does not declare it; the executor admits only declared inputs",
                )
            raise _fail(
                case,
                f"{where} = {value!r} refers to {path!r}, which is not an admitted input: an "
                "adapter may reference only the paths of its immutable_input_references",
            )


def check_endpoint(job: Job, case: AdapterCase | None = None) -> None:
    """The job declares an endpoint contract and a readiness probe the contract admits."""
    if not isinstance(job.endpoint, EndpointContract) or not job.endpoint.paths:
        raise _fail(case, "the job declares no endpoint contract that admits any request path")
    if not isinstance(job.readiness, ReadinessProbe):
        raise _fail(case, "the job declares no readiness probe")
    if not job.endpoint.admits(job.readiness.path):
        raise _fail(
            case,
            f"the readiness probe's path {job.readiness.path!r} is not admitted by the endpoint "
            f"contract (it admits {list(job.endpoint.paths)}); the executor could never probe it",
        )


def check_capabilities(job: Job, case: AdapterCase | None = None) -> None:
    """The job names only :data:`KNOWN_CAPABILITIES`."""
    unknown = sorted(set(job.capabilities) - KNOWN_CAPABILITIES)
    if unknown:
        raise _fail(
            case,
            f"the job declares unknown capabilities {unknown}; known ones are "
            f"{sorted(KNOWN_CAPABILITIES)}",
        )
    for name in job.capabilities:
        route = CAPABILITY_ROUTES.get(name)
        if route is not None and job.endpoint is not None and not job.endpoint.admits(route):
            raise _fail(
                case,
                f"the job declares {name!r} but its endpoint contract does not admit {route}, "
                "where the gateway sends those requests",
            )


def _as_case(index: int, case: Any) -> AdapterCase:
    if isinstance(case, AdapterCase):
        return case
    specification, model_record, placement, inputs = case
    return AdapterCase(
        specification=specification,
        model_record=model_record,
        placement=placement,
        inputs=inputs,
        name=f"case {index}",
    )


def check_adapter(
    factory: AdapterFactory,
    *,
    cases: Iterable[AdapterCase | Sequence[Any]],
    allowed_paths: Collection[str] = (),
) -> list[Job]:
    """Run every check of the kit over ``cases``; return the job of each case, in order.

    :param factory: what the plugin passes to ``registry.add``: called with no
        arguments, it returns a new adapter (the kit calls it more than once).
    :param cases: at least one :class:`AdapterCase`, or a tuple
        ``(specification, model_record, placement, immutable_input_references)``.
    :param allowed_paths: absolute paths inside the runtime image that the job
        may name although they are no input (for instance a fixed config file).
    :raises AdapterConformanceError: naming the case and the rule it broke.
    """
    check_api_version(factory())
    jobs = []
    for index, raw in enumerate(cases):
        case = _as_case(index, raw)
        job = check_pure(factory, case)
        check_inputs(job, case, allowed_paths=allowed_paths)
        check_endpoint(job, case)
        check_capabilities(job, case)
        jobs.append(job)
    if not jobs:
        raise AdapterConformanceError("check_adapter needs at least one case")
    return jobs
