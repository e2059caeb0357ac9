"""The inference service specification: runtime, placements and resource limits.

A :class:`Specification` is what an operator declares for one managed inference
service. It names an installed executor :class:`Runtime` and one or more explicit
:class:`Placement` objects (a node and the :class:`ResourceLimits` reserved there).

This module also holds the small validators and converters the other schema
modules share. They raise :class:`~ficc_core.schema._convert.FieldError`, so a
refusal made while structuring JSON is reported at the field's own path.
"""

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ._convert import MAX_SAFE_INTEGER, FieldError, finite_float, integer, number
from ._convert import digest as _digest

# -- Checks shared by the schema modules --------------------------------------------

DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")
IDENTIFIER_PATTERN = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ALIAS_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]

# -- Ranges (docs/api.md renders each field's from its declaration) ------------------

#: Tokens of context: above the largest window any released model declares (10M), and
#: within the 32-bit integer llama.cpp (``--ctx-size``), vLLM and Ollama parse.
MAX_CONTEXT = 2**24
#: Requests one replica serves at once: llama.cpp slots, vLLM ``--max-num-seqs``.
MAX_CONCURRENCY = 4096
#: GPU device indices a node reports and a placement reserves.
MAX_GPU_INDEX = 1023
#: Layers offloaded to GPUs; engines read any number above the model's layer count as all.
MAX_GPU_LAYERS = 100_000
#: Tensor-parallel degree.
MAX_PARALLELISM = 1024
#: CPU cores one replica reserves, or one node reports.
MAX_CPUS = 65536.0
#: Processes one replica may run (Linux's largest ``pid_max``).
MAX_PIDS = 4_194_304
#: Open files one replica may hold (Linux's largest ``fs.nr_open``).
MAX_OPEN_FILES = 1_073_741_816
#: Seconds: a request deadline, a readiness or bootstrap timeout (seven days).
MAX_SECONDS = 7 * 24 * 3600.0
#: The shortest ``scaling.idle_timeout`` (seconds): a replica idle for less is not idle,
#: only between requests, and stopping it costs a reload at the next one.
MIN_IDLE_TIMEOUT = 10.0
#: Bytes of host prompt cache: a pebibyte, whose MiB count (2^30) is within the 32-bit
#: integer llama-server parses ``--cache-ram`` into.
MAX_PROMPT_CACHE = 2**50


def _shown(value: Any) -> str:
    """``value`` as a client wrote it (JSON), shortened for an error message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_tuple(value: Any) -> tuple[Any, ...]:
    # A string is iterable but never a list of items; a set has no stable order.
    if isinstance(value, str | bytes | Mapping | set | frozenset) or not isinstance(
        value, Iterable
    ):
        raise TypeError(f"expected a list or tuple, got {type(value).__name__}")
    return tuple(value)


def _as_sorted_set(value: Any) -> tuple[str, ...]:
    """Canonicalise a set of names: any iterable of strings, sorted, duplicates dropped."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"expected a collection of strings, got {type(value).__name__}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"expected strings, got {type(item).__name__}")
    return tuple(sorted(set(items)))


def _as_dict(value: Any) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__}")
    return dict(value)


def _as_float(value: Any) -> float:
    # Canonical JSON must not depend on whether a caller wrote 600 or 600.0.
    return finite_float(value)


def _optional(validator: _Validator) -> _Validator:
    def check(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return check


def _text(max_length: int = 256) -> _Validator:
    """A non-empty string of at most ``max_length`` characters without control characters."""

    def check(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if not isinstance(value, str):
            raise FieldError(attribute.name, f"must be a string, got {_shown(value)}")
        if not value:
            raise FieldError(attribute.name, "must not be empty")
        if len(value) > max_length:
            raise FieldError(attribute.name, f"must be at most {max_length} characters long")
        if _CONTROL.search(value):
            raise FieldError(attribute.name, "must not contain control characters")

    return check


def _matches(pattern: re.Pattern[str], description: str) -> _Validator:
    def check(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise FieldError(attribute.name, f"must be {description}, got {_shown(value)}")

    return check


def _one_of(*allowed: str) -> _Validator:
    names = ", ".join(f'"{name}"' for name in allowed)

    def check(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if value not in allowed or not isinstance(value, str):
            raise FieldError(attribute.name, f"must be one of {names}, got {_shown(value)}")

    return check


_digest_string = _matches(
    DIGEST_PATTERN, 'a digest: "sha256:" followed by 64 lowercase hexadecimal digits'
)
_identifier = _matches(
    IDENTIFIER_PATTERN,
    'an identifier: a lowercase letter, then up to 63 lowercase letters, digits, ".", "_" or "-"',
)
_node_id = _matches(
    NODE_ID_PATTERN,
    'a node ID: a letter or digit, then up to 62 letters, digits, ".", "_" or "-"',
)


def _items(kind: type, *, non_empty: bool = False, noun: str = "") -> _Validator:
    """Each item of a tuple is a ``kind``; with ``non_empty``, there is at least one ``noun``."""

    def check(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if non_empty and not value:
            raise FieldError(attribute.name, f"must list at least one {noun or kind.__name__}")
        for index, item in enumerate(value):
            if not isinstance(item, kind):
                raise FieldError(
                    f"{attribute.name}[{index}]",
                    f"must be a {kind.__name__}, got {_shown(item)}",
                )

    return check


# -- The specification ------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GpuRequest:
    """One GPU reserved for a placement.

    :ivar index: the device index on the node, as the executor snapshot reports it (0 to 1,023).
    :ivar memory_bytes: device memory reserved on that GPU, in bytes (1 to 2^53 - 1).
    """

    index: int = integer(0, MAX_GPU_INDEX)
    memory_bytes: int = integer(1, MAX_SAFE_INTEGER)


def _distinct_gpus(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    seen: set[int] = set()
    for position, gpu in enumerate(value):
        if gpu.index in seen:
            raise FieldError(
                f"{attribute.name}[{position}].index",
                f"reserves GPU {gpu.index} twice; list each GPU once",
            )
        seen.add(gpu.index)


@attrs.frozen(kw_only=True)
class ResourceLimits:
    """The resources an executor reserves and enforces for one replica.

    :ivar cpus: CPU cores, fractional allowed (more than 0, at most 65,536).
    :ivar memory_bytes: memory limit in bytes (1 to 2^53 - 1).
    :ivar gpus: the GPUs reserved, each at most once; empty for a CPU-only replica.
    :ivar pids: optional limit on the number of processes (1 to 4,194,304).
    :ivar open_files: optional limit on open file descriptors (1 to 1,073,741,816).
    """

    cpus: float = number(0, MAX_CPUS, above=True)
    memory_bytes: int = integer(1, MAX_SAFE_INTEGER)
    gpus: tuple[GpuRequest, ...] = attrs.field(
        default=(), converter=_as_tuple, validator=[_items(GpuRequest), _distinct_gpus]
    )
    pids: int | None = integer(1, MAX_PIDS, default=None)
    open_files: int | None = integer(1, MAX_OPEN_FILES, default=None)


@attrs.frozen(kw_only=True)
class Placement:
    """One replica of a service: the node it runs on and the resources it reserves there.

    :ivar node_id: the executor node's ID (a letter or digit, then up to 62 letters,
        digits, ``.``, ``_`` or ``-``).
    :ivar limits: the resources reserved and enforced on that node.
    """

    node_id: str = attrs.field(validator=_node_id)
    limits: ResourceLimits = attrs.field(validator=attrs.validators.instance_of(ResourceLimits))


@attrs.frozen(kw_only=True)
class Runtime:
    """An installed, immutable executor runtime, bound by digests.

    :ivar executor_provider: the executor provider that runs it (``process``, ``container``).
    :ivar package_digest: ``sha256:<hex>`` of the executor provider's package.
    :ivar image_digest: ``sha256:<hex>`` of the runtime image holding the engine executable.
    :ivar isolation: the isolation the provider applies (an identifier such as ``container``).
    :ivar network: the network the engine may use; ``"none"`` (the default) for every
        managed inference service.
    """

    executor_provider: str = attrs.field(validator=_identifier)
    package_digest: str = attrs.field(validator=_digest_string)
    image_digest: str = attrs.field(validator=_digest_string)
    isolation: str = attrs.field(validator=_identifier)
    network: str = attrs.field(default="none", validator=_identifier)


def _no_network(_instance: Any, _attribute: "attrs.Attribute[Any]", runtime: Runtime) -> None:
    if runtime.network != "none":
        raise FieldError(
            "runtime.network",
            f'must be "none" for a managed inference service, got {_shown(runtime.network)}; '
            "engines never get network access",
        )


def _tensor_split(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    if not value:
        raise FieldError(attribute.name, "must list at least one share, or be left out")
    for index, share in enumerate(value):
        if not math.isfinite(share) or share < 0:
            raise FieldError(
                f"{attribute.name}[{index}]",
                f"must be a finite number of at least 0, got {share:g}",
            )
    if not any(value):
        raise FieldError(attribute.name, "must give at least one GPU a share above 0")


def _as_optional_floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else tuple(_as_float(share) for share in _as_tuple(value))


#: Extra model names, and fallbacks, one service may list.
MAX_NAMES = 16
#: Characters of a service's description.
MAX_DESCRIPTION = 1000


def _aliases(noun: str) -> _Validator:
    """An optional list of at most :data:`MAX_NAMES` distinct aliases (``ALIAS_PATTERN``)."""

    def check(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if value is None:
            return
        if len(value) > MAX_NAMES:
            raise FieldError(attribute.name, f"must list at most {MAX_NAMES} {noun}")
        for index, name in enumerate(value):
            if not isinstance(name, str) or not ALIAS_PATTERN.fullmatch(name):
                raise FieldError(
                    f"{attribute.name}[{index}]",
                    f"must be an alias of 1 to 64 characters, got {_shown(name)}",
                )
            if name in value[:index]:
                raise FieldError(f"{attribute.name}[{index}]", f"repeats {_shown(name)}")

    return check


def _as_optional_names(value: Any) -> tuple[str, ...] | None:
    return None if value is None else _as_tuple(value)


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a service's model can do beyond what its engine adapter declares.

    An adapter knows what its engine serves (chat, streaming, embeddings,
    completions); whether the model behind it handles tool calls or images depends
    on the model and its chat template, which only the operator can vouch for.

    :ivar tools: the model answers tool (function) calls.
    :ivar vision: the model reads images in chat messages.
    """

    tools: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )
    vision: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool))
    )

    def claimed(self) -> tuple[str, ...]:
        """The capability names claimed here (``tools``, ``vision``)."""
        return tuple(name for name in ("tools", "vision") if getattr(self, name))


#: Replicas a scaled service may run at most (``scaling.max``).
MAX_REPLICAS = 1024


@attrs.frozen(kw_only=True)
class Scaling:
    """How many of a service's placements run, by demand (docs/inference.md, "Scaling").

    Without it every placement runs a replica while the service runs (the contract's
    behaviour). With it the placements are candidates: ``min`` replicas always run,
    another starts on a free candidate when requests queue, and one that served nothing
    for ``idle_timeout`` stops while more than ``min`` run. ``min = 0`` makes the service
    on-demand: it takes no memory while nobody uses it and wakes on the next request.

    :ivar min: replicas that always run (0 to ``max``); 0 is on-demand.
    :ivar max: replicas that may run at once (1 to the number of placements); absent
        means every placement.
    :ivar idle_timeout: seconds a replica may serve nothing before it stops (at least
        :data:`MIN_IDLE_TIMEOUT`, at most seven days); absent means the ``idle_timeout``
        setting. Minutes, not seconds: a stopped replica loses the KV cache that affinity
        filled, and one that stops within seconds is woken again by the next request.
    """

    min: int = integer(0, MAX_REPLICAS, default=1)
    max: int | None = integer(1, MAX_REPLICAS, default=None)
    idle_timeout: float | None = number(MIN_IDLE_TIMEOUT, MAX_SECONDS, default=None)

    def __attrs_post_init__(self) -> None:
        if self.max is not None and self.min > self.max:
            raise FieldError("min", f"must be at most max ({self.max}), got {self.min}")


@attrs.frozen(kw_only=True)
class Specification:
    """What an operator declares for one managed inference service.

    :ivar alias: the service's name, also the model name clients send (1 to 64
        characters: a letter or digit, then letters, digits, ``.``, ``_``, ``:`` or ``-``).
    :ivar model_id: the registered model the service serves.
    :ivar engine: the engine adapter that translates this specification into a job
        (``llama_cpp``, ``ollama``, ``vllm`` or an installed third-party adapter).
    :ivar runtime: the installed executor runtime; its network must be ``"none"``.
    :ivar image_executable: the engine executable inside the runtime image.
    :ivar context: the context window in tokens (1 to 16,777,216).
    :ivar concurrency: requests one replica serves at once (1 to 4,096).
    :ivar placements: one or more explicit placements, one per replica.
    :ivar gpu_layers: layers to offload to GPUs (0 to 100,000); absent means the engine's
        default. Use a number at least the model's layer count to offload every layer.
    :ivar tensor_split: the share of the model each GPU holds, in GPU order (each 0 or
        more, at least one above 0); absent means the engine decides.
    :ivar parallelism: tensor-parallel degree for engines that support it (1 to 1,024).
    :ivar request_deadline: seconds one inference request may take before it is
        cancelled (more than 0, at most seven days); absent means no deadline beyond the
        client's.
    :ivar description: what the service is for, in a line (at most 1,000 characters);
        clients read it in ``/v1/models``, the only view most of them have when they pick
        which model name to send.
    :ivar aliases: more model names the project endpoint routes to this service (at most
        16), after every service's own alias; the model's manifest name is the last.
    :ivar fallbacks: aliases of other services of the project, tried in order on the
        project endpoint when this one has no ready replica, is saturated, or its engine
        fails before the first byte (at most 16).
    :ivar context_length: tokens one request may use, prompt and completion together (1
        to ``context``); absent means the engine's per-request context, ``context``,
        bounded by the model's own trained context where its metadata declares one.
    :ivar max_output: tokens one completion may generate (1 to the context length);
        absent means no bound beyond the context.
    :ivar capabilities: what the model can do beyond the engine's claims (``tools``,
        ``vision``).
    :ivar scaling: how many placements run, by demand (:class:`Scaling`); absent means
        every placement runs a replica.
    :ivar prompt_cache_bytes: host memory, in bytes, the engine may fill with the prompt
        caches of idle slots (llama.cpp's ``--cache-ram``; 0 to 2^50, 0 keeps none),
        counted in the replica's memory estimate; absent leaves the engine's default,
        which no estimate counts.
    """

    alias: str = attrs.field(
        validator=_matches(
            ALIAS_PATTERN,
            'an alias of 1 to 64 characters: a letter or digit, then letters, digits, ".", '
            '"_", ":" or "-"',
        )
    )
    model_id: str = attrs.field(validator=_text())
    engine: str = attrs.field(validator=_identifier)
    runtime: Runtime = attrs.field(validator=[attrs.validators.instance_of(Runtime), _no_network])
    image_executable: str = attrs.field(validator=_text(4096))
    context: int = integer(1, MAX_CONTEXT)
    concurrency: int = integer(1, MAX_CONCURRENCY)
    placements: tuple[Placement, ...] = attrs.field(
        converter=_as_tuple, validator=_items(Placement, non_empty=True, noun="placement")
    )
    gpu_layers: int | None = integer(0, MAX_GPU_LAYERS, default=None)
    tensor_split: tuple[float, ...] | None = attrs.field(
        default=None, converter=_as_optional_floats, validator=_tensor_split
    )
    parallelism: int | None = integer(1, MAX_PARALLELISM, default=None)
    request_deadline: float | None = number(0, MAX_SECONDS, above=True, default=None)
    # Added by the routing step; None is omitted from the canonical JSON, so the
    # digests of specifications without them do not change.
    description: str | None = attrs.field(default=None, validator=_optional(_text(MAX_DESCRIPTION)))
    aliases: tuple[str, ...] | None = attrs.field(
        default=None, converter=_as_optional_names, validator=_aliases("aliases")
    )
    fallbacks: tuple[str, ...] | None = attrs.field(
        default=None, converter=_as_optional_names, validator=_aliases("fallbacks")
    )
    context_length: int | None = integer(1, MAX_CONTEXT, default=None)
    max_output: int | None = integer(1, MAX_CONTEXT, default=None)
    capabilities: Capabilities | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(Capabilities)),
    )
    # Added by the scaling step (None omitted from the canonical JSON, as above).
    scaling: Scaling | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(Scaling)),
    )
    # Added with the host prompt cache (None omitted from the canonical JSON, as above).
    prompt_cache_bytes: int | None = integer(0, MAX_PROMPT_CACHE, default=None)

    def __attrs_post_init__(self) -> None:
        if self.context_length is not None and self.context_length > self.context:
            raise FieldError(
                "context_length",
                f"must be at most the context ({self.context}): the engine holds no more "
                f"per request, got {self.context_length}",
            )
        if self.max_output is not None and self.max_output > (self.context_length or self.context):
            raise FieldError(
                "max_output",
                f"must be at most the context length ({self.context_length or self.context}), "
                f"got {self.max_output}",
            )
        if self.fallbacks is not None and self.alias in self.fallbacks:
            raise FieldError("fallbacks", f"must not name the service itself ({self.alias!r})")
        scaling = self.scaling
        if scaling is not None:
            count = len(self.placements)
            if scaling.max is not None and scaling.max > count:
                raise FieldError(
                    "scaling.max",
                    f"must be at most the number of placements ({count}): each replica runs "
                    f"on one of them, got {scaling.max}",
                )
            if scaling.min > count:
                raise FieldError(
                    "scaling.min",
                    f"must be at most the number of placements ({count}), got {scaling.min}",
                )

    @property
    def max_replicas(self) -> int:
        """Replicas that may run at once: ``scaling.max``, else every placement."""
        scaling = self.scaling
        if scaling is None or scaling.max is None:
            return len(self.placements)
        return scaling.max

    @property
    def min_replicas(self) -> int:
        """Replicas that always run: ``scaling.min``, else every placement."""
        return len(self.placements) if self.scaling is None else self.scaling.min

    def digest(self) -> str:
        """Return ``sha256:<hex>`` of this specification's canonical JSON."""
        return _digest(self)
