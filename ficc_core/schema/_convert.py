"""The one private cattrs converter, canonical JSON and digests.

Structuring is strict: unknown keys are refused, ``"5"`` is not an int and
``true`` is not a number. Every refusal lists each bad field by its path
(``$.placements[0].limits.cpus``) so a client can fix all of them at once.

Structuring is also bounded, here and nowhere else: every integer lies in 64 bits,
every number is finite, every string is Unicode text of at most
:data:`MAX_STRING` characters (a field may declare more with
``metadata={MAX_LENGTH: n}``), and every integer field of the data model declares
its own range with :func:`integer` (a number field with :func:`number`), which
docs/api.md renders (``python -m ficc_core.devtools.docs_ranges``).

Unstructuring omits an optional field whose value is absent (``None`` with a
default of ``None``): fields added to a class later therefore do not change the
canonical form, nor the digest, of objects that do not use them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    list_structure_factory,
    mapping_structure_factory,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ..base.errors import InvalidRequest
from ..base.strictjson import INT64_MAX, INT64_MIN

T = TypeVar("T")

#: A string field holds at most this many characters unless it declares ``MAX_LENGTH``.
MAX_STRING = 65536
#: The largest integer every JSON reader keeps exactly (JavaScript's
#: ``Number.MAX_SAFE_INTEGER``): the bound of byte counts, offsets and revisions.
MAX_SAFE_INTEGER = 2**53 - 1
#: Field metadata: the most characters a string field holds (instead of ``MAX_STRING``).
MAX_LENGTH = "ficc.max_length"
#: Field metadata set by :func:`integer` and :func:`number`: the range check, whose
#: ``minimum``, ``maximum`` and ``above`` docs/api.md renders.
RANGE = "ficc.range"

_SURROGATE = re.compile("[\ud800-\udfff]")

_converter = cattrs.Converter(forbid_extra_keys=True)


def _structure_str(value: Any, _type: Any, max_length: int = MAX_STRING) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected string, got {_json_type(value)}")
    if len(value) > max_length:
        raise ValueError(f"must be at most {max_length} characters long")
    if _SURROGATE.search(value):
        raise ValueError("must be Unicode text (it holds a lone UTF-16 surrogate)")
    return value


def _structure_bool(value: Any, _type: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected boolean, got {_json_type(value)}")
    return value


def _structure_int(value: Any, _type: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected integer, got {_json_type(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"must be an integer from {INT64_MIN} to {INT64_MAX}")
    return int(value)


def finite_float(value: Any) -> float:
    """``value`` (a JSON number) as a finite float; refuse booleans, NaN and overflow."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected number, got {_json_type(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    return number


_converter.register_structure_hook(str, _structure_str)
_converter.register_structure_hook(bool, _structure_bool)
_converter.register_structure_hook(int, _structure_int)
_converter.register_structure_hook(float, lambda value, _type: finite_float(value))


def _is_homogeneous_tuple(type_: Any) -> bool:
    args = get_args(type_)
    return get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_list(type_: Any) -> bool:
    return get_origin(type_) is list


def _is_dict(type_: Any) -> bool:
    return get_origin(type_) is dict


def _only(json_name: str, accepts: type | tuple[type, ...], base: Any) -> Any:
    # cattrs turns any iterable into a tuple or list ("abc" -> ("a", "b", "c")) and fails
    # obscurely on a non-mapping; a JSON array or object is required instead.
    def factory(type_: Any, converter: cattrs.Converter) -> Any:
        inner = base(type_, converter)

        def structure(value: Any, target: Any) -> Any:
            if not isinstance(value, accepts):
                raise TypeError(f"expected {json_name}, got {_json_type(value)}")
            return inner(value, target)

        return structure

    return factory


_converter.register_structure_hook_factory(
    _is_homogeneous_tuple, _only("array", (list, tuple), homogenous_tuple_structure_factory)
)
_converter.register_structure_hook_factory(
    _is_list, _only("array", (list, tuple), list_structure_factory)
)
_converter.register_structure_hook_factory(
    _is_dict, _only("object", dict, mapping_structure_factory)
)


def _literal_factory(type_: Any) -> Any:
    allowed = get_args(type_)
    names = ", ".join(json.dumps(value) for value in allowed)

    def structure(value: Any, _type: Any) -> Any:
        # Compare types too: 1 == True, and neither should stand for the other.
        if not any(type(value) is type(a) and value == a for a in allowed):
            raise ValueError(f"expected one of {names}, got {json.dumps(value, default=repr)}")
        return value

    return structure


_converter.register_structure_hook_factory(
    lambda type_: get_origin(type_) is Literal, _literal_factory
)


def _is_attrs(cls: Any) -> bool:
    return isinstance(cls, type) and attrs.has(cls)


def _unstructure_factory(cls: type) -> Any:
    # Any: cattrs takes the per-field overrides as **kwargs beside its own options.
    omit: dict[str, Any] = {
        field.name: override(omit_if_default=True)
        for field in attrs.fields(cls)
        if field.default is None
    }
    return make_dict_unstructure_fn(cls, _converter, **omit)


def _longer_str(max_length: int) -> Any:
    return lambda value, type_: _structure_str(value, type_, max_length)


def _structure_factory(cls: type) -> Any:
    longer: dict[str, Any] = {  # Any: as in _unstructure_factory
        field.name: override(struct_hook=_longer_str(field.metadata[MAX_LENGTH]))
        for field in attrs.fields(cls)
        if MAX_LENGTH in field.metadata
    }
    inner: Callable[[Any, Any], Any] = make_dict_structure_fn(
        cls, _converter, _cattrs_forbid_extra_keys=True, **longer
    )

    def structure_object(value: Any, type_: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected object, got {_json_type(value)}")
        return inner(value, type_)

    return structure_object


_converter.register_unstructure_hook_factory(_is_attrs, _unstructure_factory)
_converter.register_structure_hook_factory(_is_attrs, _structure_factory)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _describe(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, KeyError):
        return "required field is missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return "unknown field"
    text = str(exc) or type(exc).__name__
    return text


class FieldError(ValueError):
    """Raised by a validator to refuse one field; the error path then names the field.

    ``raise FieldError(attribute.name, "must be positive")`` in an attrs validator
    reports ``$.<path>.<field>: must be positive``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


# attrs' own validators start their messages with the quoted field name.
_ATTRS_MESSAGE = re.compile(r"^'([A-Za-z_][A-Za-z0-9_]*)' ")


def _field_of(exc: BaseException) -> tuple[str | None, str]:
    if isinstance(exc, FieldError):
        return exc.field, exc.message
    attribute = next((a for a in exc.args[1:2] if isinstance(a, attrs.Attribute)), None)
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    if attribute is not None:
        return attribute.name, text
    match = _ATTRS_MESSAGE.match(text)
    if match:
        return match.group(1), text
    return None, text


def _shown_number(value: Any) -> str:
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return "a larger number"
    return f"{value:g}" if isinstance(value, float) else str(value)


@attrs.frozen
class _Range:
    minimum: float
    maximum: float
    above: bool  # the minimum itself is excluded
    kind: type[int] | type[float]

    def __call__(self, _instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and attribute.default is None:
            return
        noun = "an integer" if self.kind is int else "a finite number"
        if isinstance(value, bool) or not isinstance(value, self.kind):
            shown = json.dumps(value) if value is None or isinstance(value, bool) else None
            raise FieldError(attribute.name, f"must be {noun}, got {shown or _json_type(value)}")
        if self.kind is float and not math.isfinite(value):
            raise FieldError(attribute.name, f"must be {noun}, got {_shown_number(value)}")
        low = value > self.minimum if self.above else value >= self.minimum
        if not low or value > self.maximum:
            raise FieldError(
                attribute.name, f"must be {self.describe()}, got {_shown_number(value)}"
            )

    def describe(self) -> str:
        """The range in words: ``from 1 to 4096``, ``more than 0 and at most 65536``."""
        low, high = _shown_number(self.minimum), _shown_number(self.maximum)
        if self.minimum == self.maximum:
            return low
        if self.above:
            return f"more than {low} and at most {high}"
        return f"from {low} to {high}"


def integer(minimum: int, maximum: int, **kwargs: Any) -> Any:
    """An attrs field for an integer from ``minimum`` to ``maximum``, both included.

    Every integer field of the data model is declared with this, so its range is
    checked in one way and documented from one place. ``default=None`` makes the
    field optional; further validators may follow in ``validator``.
    """
    return _ranged(_Range(minimum, maximum, False, int), kwargs)


def number(minimum: float, maximum: float, *, above: bool = False, **kwargs: Any) -> Any:
    """An attrs field for a finite number from ``minimum`` (excluded with ``above``) to
    ``maximum``; integers are stored as floats, so ``600`` and ``600.0`` are one value."""
    kwargs.setdefault("converter", _int_as_float)
    return _ranged(_Range(minimum, maximum, above, float), kwargs)


def _int_as_float(value: Any) -> Any:
    # The range check that follows refuses anything else, naming the field.
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    return value


def _ranged(check: _Range, kwargs: dict[str, Any]) -> Any:
    extra = kwargs.pop("validator", [])
    validators = [check, *(extra if isinstance(extra, list) else [extra])]
    metadata = {**kwargs.pop("metadata", {}), RANGE: check}
    return attrs.field(validator=validators, metadata=metadata, **kwargs)


class SchemaError(InvalidRequest):
    """A document does not match its schema; ``details.errors`` lists each field path."""

    def __init__(self, errors: list[dict[str, str]], *, what: str = "request body") -> None:
        first = errors[0] if errors else {"path": "$", "message": "invalid"}
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(
            f"The {what} is invalid at {first['path']}: {first['message']}{more}.",
            details={"errors": errors},
        )
        self.errors = errors


def check_range(cls: type, name: str, value: Any, *, what: str) -> None:
    """Refuse ``value`` for the ranged field ``name`` of ``cls`` as structuring would:
    a :class:`SchemaError` at ``$.name`` (for a step that reads the field before the
    whole document is structured)."""
    attribute = attrs.fields_dict(cls)[name]
    try:
        attribute.metadata[RANGE](None, attribute, value)
    except FieldError as exc:
        raise SchemaError([{"path": f"$.{name}", "message": exc.message}], what=what) from None


def _collect(exc: BaseException, path: str) -> list[dict[str, str]]:
    # cattrs reports extra keys as one error for the whole object; name each key.
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return [
            {"path": f"{path}.{key}", "message": "unknown field"}
            for key in sorted(exc.extra_fields)
        ]
    if isinstance(exc, cattrs.ClassValidationError | cattrs.IterableValidationError):
        found: list[dict[str, str]] = []
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            if name is not None:
                child = f"{path}.{name}"
            elif index is not None:
                child = f"{path}[{index!r}]" if not isinstance(index, int) else f"{path}[{index}]"
            else:
                child = path
            found.extend(_collect(inner, child))
        for inner in without:
            found.extend(_collect(inner, path))
        return found
    if isinstance(exc, BaseExceptionGroup):
        return [error for inner in exc.exceptions for error in _collect(inner, path)]
    if isinstance(exc, ValueError | TypeError) and not isinstance(exc, KeyError):
        field, message = _field_of(exc)
        if field is not None:
            return [{"path": f"{path}.{field}", "message": message}]
    return [{"path": path, "message": _describe(exc, None)}]


def structure(data: Any, cls: type[T], *, what: str = "request body") -> T:
    """Build ``cls`` from plain JSON data, or raise :class:`SchemaError` with field paths."""
    if _is_attrs(cls) and not isinstance(data, dict):
        raise SchemaError(
            [{"path": "$", "message": f"expected object, got {_json_type(data)}"}], what=what
        )
    try:
        return _converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        raise SchemaError(_collect(exc, "$"), what=what) from None


def known_fields(data: Any, cls: type) -> tuple[Any, list[str]]:
    """``data`` without the keys ``cls`` (an attrs class) and its nested classes do not
    know, and the paths of those left out (``$.resources.gpus[0].vendor``).

    For a document from a newer peer (a node agent one minor protocol version ahead):
    its optional additions are ignored, while every known field is kept as sent and
    then structured as strictly as ever, so none is ever read in another sense.
    Anything not shaped like ``cls`` is returned as it is, for :func:`structure` to refuse.
    """
    dropped: list[str] = []
    return _known(data, cls, "$", dropped), dropped


def _known(data: Any, type_: Any, path: str, dropped: list[str]) -> Any:
    args = [arg for arg in get_args(type_) if arg is not type(None)]
    if _is_attrs(type_) and isinstance(data, dict):
        fields = attrs.fields_dict(type_)
        kept = {}
        for key, value in data.items():
            field = fields.get(key)
            if field is None:
                dropped.append(f"{path}.{key}")
                continue
            kept[key] = _known(value, field.type, f"{path}.{key}", dropped)
        return kept
    if isinstance(type_, str):
        return data  # an unresolved annotation: nothing nested to look into
    if get_origin(type_) in (tuple, list) and isinstance(data, list) and args:
        inner = args[0]
        return [_known(item, inner, f"{path}[{n}]", dropped) for n, item in enumerate(data)]
    if len(args) == 1 and get_origin(type_) not in (tuple, list, dict):  # X | None
        return _known(data, args[0], path, dropped)
    return data


def unstructure(obj: Any) -> Any:
    """Return the plain JSON form of ``obj`` (absent optional fields omitted)."""
    return _converter.unstructure(obj)


def canonical_json(obj: Any) -> bytes:
    """Return the canonical UTF-8 JSON of ``obj``: sorted keys, compact separators."""
    return json.dumps(
        unstructure(obj),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def digest(obj: Any) -> str:
    """Return ``"sha256:<hex>"`` of the canonical JSON of ``obj`` (plan digests use this)."""
    return "sha256:" + hashlib.sha256(canonical_json(obj)).hexdigest()
