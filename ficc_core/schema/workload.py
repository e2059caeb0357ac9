"""The contributor workload: what a controller plans onto one node, fenced by its digest.

An inference replica is a contributor workload with a ``model_revision`` and an
optional immutable :class:`~ficc_core.schema.job.EndpointContract`. Those two
fields came later than the rest: when absent they are left out of the canonical
JSON, so a legacy workload keeps exactly the plan digest it always had.
"""

from typing import Any

import attrs

from ._convert import MAX_SAFE_INTEGER, FieldError, integer
from ._convert import digest as _digest
from .job import EndpointContract, Fence
from .spec import (
    ResourceLimits,
    Runtime,
    _as_tuple,
    _items,
    _node_id,
    _optional,
    _text,
)


def _arguments(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    _items(str)(_instance, attribute, value)
    for index, argument in enumerate(value):
        if "\x00" in argument:
            raise FieldError(f"{attribute.name}[{index}]", "must not contain NUL")


@attrs.frozen(kw_only=True)
class Workload:
    """One contributor workload (for inference, one replica) planned onto one node.

    :ivar workload_id: the workload's ID.
    :ivar project_id: the project that owns it.
    :ivar node_id: the executor node it is planned onto.
    :ivar runtime: the installed executor runtime that runs it.
    :ivar argv: the command line the executor runs.
    :ivar limits: the resources reserved and enforced for it.
    :ivar generation: the generation it belongs to (1 or more); a replaced service
        starts the next one.
    :ivar model_revision: for an inference replica, the revision of the model it serves.
        Absent (and left out of the canonical JSON) for other workloads.
    :ivar endpoint: for an inference replica, the immutable endpoint contract the
        executor enforces. Absent (and left out) for other workloads.
    """

    workload_id: str = attrs.field(validator=_text(128))
    project_id: str = attrs.field(validator=_text(128))
    node_id: str = attrs.field(validator=_node_id)
    runtime: Runtime = attrs.field(validator=attrs.validators.instance_of(Runtime))
    argv: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_arguments)
    limits: ResourceLimits = attrs.field(validator=attrs.validators.instance_of(ResourceLimits))
    generation: int = integer(1, MAX_SAFE_INTEGER)
    # Added for inference; None is omitted from the canonical JSON (legacy digests hold).
    model_revision: str | None = attrs.field(default=None, validator=_optional(_text()))
    endpoint: EndpointContract | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(EndpointContract)),
    )

    def plan_digest(self) -> str:
        """Return ``sha256:<hex>`` of the canonical JSON, the digest every fence carries."""
        return _digest(self)

    def fence(self, attempt_id: str) -> Fence:
        """Return the fence for an attempt at running this workload."""
        return Fence(
            attempt_id=attempt_id, generation=self.generation, plan_digest=self.plan_digest()
        )
