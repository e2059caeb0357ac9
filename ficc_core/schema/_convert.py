"""The one private cattrs converter, canonical JSON and digests.

Structuring is strict: unknown keys are refused, ``"5"`` is not an int and
``true`` is not a number. Every refusal lists each bad field by its path
(``$.placements[0].limits.cpus``) so a client can fix all of them at once.

Unstructuring omits an optional field whose value is absent (``None`` with a
default of ``None``): fields added to a class later therefore do not change the
canonical form, nor the digest, of objects that do not use them.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, mapping_structure_factory
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ..errors import InvalidRequest

T = TypeVar("T")

_converter = cattrs.Converter(forbid_extra_keys=True)


def _strict(kind: type, name: str, accepts: tuple[type, ...], refuses: tuple[type, ...] = ()):
    def structure(value: Any, _type: type) -> Any:
        if isinstance(value, refuses) or not isinstance(value, accepts):
            raise TypeError(f"expected {name}, got {_json_type(value)}")
        return kind(value)

    return structure


_converter.register_structure_hook(str, _strict(str, "string", (str,)))
_converter.register_structure_hook(bool, _strict(bool, "boolean", (bool,)))
_converter.register_structure_hook(int, _strict(int, "integer", (int,), refuses=(bool,)))
_converter.register_structure_hook(float, _strict(float, "number", (int, float), refuses=(bool,)))


def _is_homogeneous_tuple(type_: Any) -> bool:
    args = get_args(type_)
    return get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_dict(type_: Any) -> bool:
    return get_origin(type_) is dict


def _only(json_name: str, accepts: type | tuple[type, ...], base: Any) -> Any:
    # cattrs turns any iterable into a tuple ("abc" -> ("a", "b", "c")) and fails
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
    omit = {
        field.name: override(omit_if_default=True)
        for field in attrs.fields(cls)
        if field.default is None
    }
    return make_dict_unstructure_fn(cls, _converter, **omit)


def _structure_factory(cls: type) -> Any:
    inner = make_dict_structure_fn(cls, _converter, _cattrs_forbid_extra_keys=True)

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
