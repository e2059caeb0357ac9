"""A bounded reader of GGUF headers: the key/value metadata and the tensor infos.

A hub preview reads only the start of a remote file, so the header is parsed from
a growing prefix fetched through ``read_range(offset, length)``; a local file is
read the same way. Nothing in the header is trusted for an allocation: every
count and length is checked against the bytes the header may span (a hard cap,
and the file size when known) before any byte is requested or any loop runs, so
a hostile header costs at most ``cap`` bytes of reading and is then refused.

The parser keeps only what a manifest needs (architecture, context length,
parameter count, quantisation, chat template, embedding or not); token arrays
and other large values are skipped, never decoded.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from ..base.errors import FiccError
from .gguf_types import (
    EMBEDDING_ARCHITECTURES,
    FILE_TYPES,
    TENSOR_TYPES,
    AttentionShape,
    attention_shape,
)

#: The most bytes a header may span before it is refused (llama.cpp vocabularies of
#: 256k tokens need about 8 MiB; this leaves room without inviting abuse).
DEFAULT_CAP = 32 * 1024 * 1024
#: The first read; each later read at least doubles what has been read.
FIRST_READ = 256 * 1024

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_KEY = 65_535
_MAX_TENSOR_NAME = 255
_MAX_ARRAY_DEPTH = 2  # an array of arrays, no deeper
_INT64_MAX = (1 << 63) - 1
_STRING, _ARRAY = 8, 9
# Value type: struct format of a fixed-size scalar.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_SIZES = {kind: struct.calcsize(fmt) for kind, fmt in _SCALARS.items()}
_INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})


class InvalidGguf(FiccError):
    """A GGUF header is malformed, hostile, unsupported or larger than admitted."""

    status = 422
    code = "invalid_gguf"


@attrs.frozen(kw_only=True)
class GgufMetadata:
    """What a GGUF header says about its model.

    :ivar version: the GGUF version (2 or 3).
    :ivar architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``, ``"bert"``).
    :ivar name: ``general.name``, if present.
    :ivar basename: ``general.basename``, the model family's short name (``"smollm2"``),
        if present: what ``ficc models add`` names a model by default.
    :ivar licence: ``general.license``, if present.
    :ivar context_length: ``{architecture}.context_length``, if present.
    :ivar parameter_count: the number of weights: the sum over tensors of their elements.
    :ivar tensor_count: how many tensors the file holds.
    :ivar file_type: ``general.file_type`` (llama.cpp's ``llama_ftype``), if present.
    :ivar quantisation: llama.cpp's name for ``file_type`` (``"Q4_K_M"``), or else
        the tensor type holding the most elements (``"Q4_1"``); None if neither.
    :ivar chat_template: whether ``tokenizer.chat_template`` is present.
    :ivar embedding: whether this is an embedding model (an encoder architecture, or
        a ``{architecture}.pooling_type`` key).
    :ivar header_bytes: where the header (magic, metadata, tensor infos) ends.
    :ivar data_offset: where the tensor data starts (``header_bytes`` aligned).
    :ivar split_count: ``split.count``: how many parts the model is split into
        (None when the file is not a part of a split GGUF).
    :ivar split_no: ``split.no``: which part this is, from 0 (None when not split).
        A split GGUF's later parts hold tensors only: their ``architecture`` is empty.
    :ivar attention: the layers and attention heads that size its KV cache, or None
        when the header does not say (what a suggested memory limit is computed from).
    """

    version: int
    architecture: str
    name: str | None
    licence: str | None
    context_length: int | None
    parameter_count: int
    tensor_count: int
    file_type: int | None
    quantisation: str | None
    chat_template: bool
    embedding: bool
    header_bytes: int
    data_offset: int
    split_count: int | None = None
    split_no: int | None = None
    attention: AttentionShape | None = None
    basename: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the fields as a JSON object."""
        return attrs.asdict(self)


@attrs.frozen
class _Array:
    kind: int
    count: int


@attrs.frozen
class _Header:
    version: int
    values: dict[str, Any]
    tensors: list[tuple[int, int]]  # (ggml type, elements)
    header_end: int
    alignment: int


class _NeedMore(Exception):
    """Raised by the parser when it needs a longer prefix (not an error)."""

    def __init__(self, end: int) -> None:
        self.end = end


class _Cursor:
    """Reads forward through a prefix; asks for more, or refuses, past its end."""

    def __init__(self, data: bytes, limit: int, size: int | None, complete: bool) -> None:
        self.data = data
        self.position = 0
        self.limit = limit
        self.size = size
        self.complete = complete

    def check(self, length: int, what: str) -> None:
        """Refuse if ``length`` more bytes cannot lie within the admitted region."""
        end = self.position + length
        if self.size is not None and end > self.size:
            raise InvalidGguf(
                f"GGUF header is corrupt or hostile: {what} reaches byte {end:,} of a "
                f"{self.size:,}-byte file",
                details={"offset": self.position, "end": end, "size": self.size},
            )
        if end > self.limit:
            raise InvalidGguf(
                f"GGUF header is too large or hostile: {what} reaches byte {end:,}, past the "
                f"{self.limit:,}-byte limit on headers",
                details={"offset": self.position, "end": end, "limit": self.limit},
            )
        if end > len(self.data):
            if self.complete:
                raise InvalidGguf(
                    f"GGUF header is truncated: {what} needs byte {end:,} of {len(self.data):,}",
                    details={"offset": self.position, "end": end, "size": len(self.data)},
                )
            raise _NeedMore(end)

    def take(self, length: int, what: str) -> bytes:
        self.check(length, what)
        start, self.position = self.position, self.position + length
        return self.data[start : self.position]

    def skip(self, length: int, what: str) -> None:
        self.check(length, what)
        self.position += length

    def scalar(self, kind: int, what: str) -> Any:
        return struct.unpack(_SCALARS[kind], self.take(_SIZES[kind], what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str, *, maximum: int | None = None, keep: bool = True) -> bytes:
        length = self.u64(f"the length of {what}")
        if maximum is not None and length > maximum:
            raise InvalidGguf(
                f"GGUF header is corrupt or hostile: {what} is {length:,} bytes long "
                f"(at most {maximum:,} admitted)",
                details={"offset": self.position - 8, "length": length},
            )
        if not keep:
            self.skip(length, what)
            return b""
        return self.take(length, what)


def _value_type(cursor: _Cursor, what: str) -> int:
    kind = cursor.u32(f"the type of {what}")
    if kind not in _SCALARS and kind not in (_STRING, _ARRAY):
        raise InvalidGguf(
            f"GGUF header is corrupt: {what} has unknown value type {kind}",
            details={"offset": cursor.position - 4, "type": kind},
        )
    return kind


def _value(cursor: _Cursor, kind: int, what: str, *, keep: bool, depth: int = 0) -> Any:
    if kind == _STRING:
        return cursor.string(what, keep=keep)
    if kind != _ARRAY:
        return cursor.scalar(kind, what)
    if depth >= _MAX_ARRAY_DEPTH:
        raise InvalidGguf(
            f"GGUF header is hostile: {what} nests arrays more than {_MAX_ARRAY_DEPTH} deep",
            details={"offset": cursor.position},
        )
    element = _value_type(cursor, f"the elements of {what}")
    count = cursor.u64(f"the length of {what}")
    if element in _SIZES:
        cursor.skip(count * _SIZES[element], f"the {count:,} elements of {what}")
        return _Array(element, count)
    # Each string or array element takes at least 8 (or 12) bytes: refuse a count
    # that cannot fit before looping over it.
    cursor.check(count * (8 if element == _STRING else 12), f"the {count:,} elements of {what}")
    for _ in range(count):
        _value(cursor, element, what, keep=False, depth=depth + 1)
    return _Array(element, count)


def _parse(data: bytes, limit: int, size: int | None, complete: bool) -> _Header:
    """Parse the header in ``data``; raise :class:`_NeedMore` if it needs a longer prefix."""
    cursor = _Cursor(data, limit, size, complete)
    magic = cursor.take(4, "the magic number")
    if magic != _MAGIC:
        raise InvalidGguf(
            f"not a GGUF file: it starts with {magic!r}, not {_MAGIC!r}",
            details={"magic": magic.hex()},
        )
    version = cursor.u32("the version")
    if version not in _VERSIONS:
        raise InvalidGguf(
            f"unsupported GGUF version {version} (2 and 3 are read; big-endian files are not)",
            details={"version": version},
        )
    tensor_count = cursor.u64("the tensor count")
    kv_count = cursor.u64("the metadata count")
    # Smallest possible entries: a key (8-byte length, empty) + type + 1-byte value,
    # and a tensor info (empty name, no dimensions, type, offset).
    cursor.check(kv_count * 13 + tensor_count * 24, f"{kv_count:,} metadata entries and tensors")
    values: dict[str, Any] = {}
    for index in range(kv_count):
        raw_key = cursor.string(f"metadata key {index}", maximum=_MAX_KEY)
        key = raw_key.decode("utf-8", errors="replace")
        if key in values:
            raise InvalidGguf(f"GGUF header repeats the metadata key {key!r}", details={"key": key})
        kind = _value_type(cursor, f"metadata {key!r}")
        # Strings are kept (bounded by the limit already); arrays are only counted.
        values[key] = _value(cursor, kind, f"metadata {key!r}", keep=True)
    alignment = values.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise InvalidGguf(
            f"GGUF general.alignment must be a power of two, got {alignment!r}",
            details={"alignment": repr(alignment)},
        )
    tensors: list[tuple[int, int, int]] = []  # (ggml type, elements, end)
    names: set[bytes] = set()
    for index in range(tensor_count):
        name = cursor.string(f"the name of tensor {index}", maximum=_MAX_TENSOR_NAME)
        shown = name.decode("utf-8", errors="replace")
        if name in names:
            raise InvalidGguf(
                f"GGUF header repeats the tensor {shown!r}", details={"tensor": shown}
            )
        names.add(name)
        dimensions = cursor.u32(f"the dimension count of tensor {shown!r}")
        if dimensions > _MAX_DIMS:
            raise InvalidGguf(
                f"GGUF tensor {shown!r} has {dimensions} dimensions (at most {_MAX_DIMS})",
                details={"tensor": shown, "dimensions": dimensions},
            )
        shape = [cursor.u64(f"the shape of tensor {shown!r}") for _ in range(dimensions)]
        elements = 1
        for extent in shape:
            elements *= extent
        if elements > _INT64_MAX:
            raise InvalidGguf(
                f"GGUF tensor {shown!r} has an impossible shape {shape}",
                details={"tensor": shown, "shape": shape},
            )
        ggml_type = cursor.u32(f"the type of tensor {shown!r}")
        if ggml_type not in TENSOR_TYPES:
            raise InvalidGguf(
                f"GGUF tensor {shown!r} has unknown type {ggml_type}",
                details={"tensor": shown, "type": ggml_type},
            )
        type_name, block, block_bytes = TENSOR_TYPES[ggml_type]
        if shape and shape[0] % block:
            raise InvalidGguf(
                f"GGUF tensor {shown!r} of type {type_name} has a row of {shape[0]} elements, "
                f"not a multiple of its block size {block}",
                details={"tensor": shown, "shape": shape},
            )
        offset = cursor.u64(f"the offset of tensor {shown!r}")
        if offset % alignment:
            raise InvalidGguf(
                f"GGUF tensor {shown!r} starts at {offset}, not a multiple of {alignment}",
                details={"tensor": shown, "offset": offset},
            )
        tensors.append((ggml_type, elements, offset + elements // block * block_bytes))
    header_end = cursor.position
    if size is not None and tensors:
        data_offset = -(-header_end // alignment) * alignment
        end = max(tensor[2] for tensor in tensors)
        if data_offset + end > size:
            raise InvalidGguf(
                f"GGUF tensor data would end at byte {data_offset + end:,} of a {size:,}-byte file",
                details={"end": data_offset + end, "size": size},
            )
    return _Header(version, values, [t[:2] for t in tensors], header_end, alignment)


def _text(values: dict[str, Any], key: str) -> str | None:
    value = values.get(key)
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else None


def _metadata(header: _Header) -> GgufMetadata:
    values = header.values
    architecture = _text(values, "general.architecture")
    split_no = values.get("split.no")
    later_part = isinstance(split_no, int) and not isinstance(split_no, bool) and split_no > 0
    if not architecture and not later_part:
        raise InvalidGguf("GGUF header has no general.architecture string")
    architecture = architecture or ""
    context = values.get(f"{architecture}.context_length")
    file_type = values.get("general.file_type")
    file_type = (
        file_type if isinstance(file_type, int) and not isinstance(file_type, bool) else None
    )
    quantisation = FILE_TYPES.get(file_type) if file_type is not None else None
    if quantisation is None and header.tensors:
        weight: Counter[int] = Counter()
        for ggml_type, elements in header.tensors:
            weight[ggml_type] += elements
        quantisation = TENSOR_TYPES[weight.most_common(1)[0][0]][0]
    context_ok = isinstance(context, int) and not isinstance(context, bool) and context > 0
    return GgufMetadata(
        version=header.version,
        architecture=architecture,
        name=_text(values, "general.name"),
        licence=_text(values, "general.license"),
        context_length=context if context_ok else None,
        parameter_count=sum(elements for _, elements in header.tensors),
        tensor_count=len(header.tensors),
        file_type=file_type,
        quantisation=quantisation,
        chat_template=isinstance(values.get("tokenizer.chat_template"), bytes),
        embedding=architecture in EMBEDDING_ARCHITECTURES
        or f"{architecture}.pooling_type" in values,
        header_bytes=header.header_end,
        data_offset=-(-header.header_end // header.alignment) * header.alignment,
        split_count=_count(values.get("split.count")),
        split_no=split_no if isinstance(split_no, int) and not isinstance(split_no, bool) else None,
        attention=attention_shape(values, architecture),
        basename=_text(values, "general.basename"),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def merge_split(parts: list[GgufMetadata]) -> GgufMetadata:
    """One model's metadata from the headers of its split parts, first part first.

    The first part holds the model's key/value metadata; every part holds some of
    its tensors, so the parameter and tensor counts are summed over the parts.

    :raises InvalidGguf: a part says it is another part, or of another number of
        parts, or the first part names no architecture.
    """
    first = parts[0]
    if len(parts) > 1:
        for number, part in enumerate(parts):
            if (part.split_no, part.split_count) != (number, len(parts)):
                raise InvalidGguf(
                    f"part {number + 1} of these {len(parts)} GGUF files says it is part "
                    f"split.no = {part.split_no} of split.count = {part.split_count}, "
                    f"not {number} of {len(parts)}",
                    details={"part": number, "split_no": part.split_no,
                             "split_count": part.split_count, "parts": len(parts)},
                )  # fmt: skip
    if not first.architecture:
        raise InvalidGguf("GGUF header has no general.architecture string")
    return attrs.evolve(
        first,
        parameter_count=sum(part.parameter_count for part in parts),
        tensor_count=sum(part.tensor_count for part in parts),
    )


def read_gguf_files(paths: list[Path], *, cap: int = DEFAULT_CAP) -> GgufMetadata:
    """The metadata of a model whose parts are ``paths`` (one file, or a split GGUF's
    parts in order), reading only their headers (blocking).

    :raises InvalidGguf: a header is malformed, or the parts do not make one model.
    """
    return merge_split([read_gguf_file(path, cap=cap) for path in paths])


def _next_length(have: int, needed: int, limit: int) -> int:
    return min(limit, max(needed, 2 * have, FIRST_READ))


async def read_gguf_header(
    read_range: Callable[[int, int], Awaitable[bytes]],
    *,
    size: int | None = None,
    cap: int = DEFAULT_CAP,
) -> GgufMetadata:
    """Read and parse a GGUF header through ``read_range(offset, length)``.

    ``read_range`` returns at most ``length`` bytes from ``offset``; fewer means the
    file ends there. Reads start at 256 KiB and at least double until the header
    is whole; none reaches past ``cap`` or ``size`` (the file size, when known).
    Parsing runs in a worker thread.

    :raises InvalidGguf: the header is malformed, hostile, truncated or too large.
    """
    limit = cap if size is None else min(cap, size)
    buffer = bytearray()
    complete = False
    want = min(limit, FIRST_READ)
    while True:
        if want > len(buffer) and not complete:
            asked = want - len(buffer)
            chunk = await read_range(len(buffer), asked)
            buffer += chunk[:asked]
            complete = len(chunk) < asked or len(buffer) == size
        try:
            header = await trio.to_thread.run_sync(_parse, bytes(buffer), limit, size, complete)
        except _NeedMore as more:
            want = _next_length(len(buffer), more.end, limit)
            continue
        return _metadata(header)


def read_gguf_file(path: Path, *, cap: int = DEFAULT_CAP) -> GgufMetadata:
    """Read the GGUF header of a local file, reading only its header region (blocking).

    :raises InvalidGguf: the header is malformed, hostile, truncated or too large.
    """
    return _metadata(_read_file_header(path, cap))


def _read_file_header(path: Path, cap: int) -> _Header:
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        limit = min(cap, size)
        want = min(limit, FIRST_READ)
        while True:
            handle.seek(0)
            data = handle.read(want)
            try:
                return _parse(data, limit, size, len(data) < want or len(data) == size)
            except _NeedMore as more:
                want = _next_length(len(data), more.end, limit)
