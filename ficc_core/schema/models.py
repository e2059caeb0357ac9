"""Model registry manifests: the immutable description of a model's files.

A :class:`ModelManifest` lists every file of a model by relative path, size and
sha256. The registry stores it once per project; registering an equal manifest
again is idempotent, which :meth:`ModelManifest.digest` makes cheap to check.
"""

import re
from typing import Any, Literal

import attrs

from ._convert import MAX_SAFE_INTEGER, FieldError, integer
from ._convert import digest as _digest
from .spec import _as_tuple, _items, _matches, _one_of, _optional, _shown, _text

SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
#: One part of a split GGUF as llama.cpp names it: ``<prefix>-00001-of-00003.gguf``.
GGUF_SPLIT_PATTERN = re.compile(r"(?P<prefix>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf")

#: The layouts a manifest can describe.
ModelFormat = Literal["gguf", "hf-directory"]


def _relative_path(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    def refuse(reason: str) -> None:
        raise FieldError(attribute.name, f"{reason}, got {_shown(value)}")

    if not isinstance(value, str) or not value:
        refuse("must be a non-empty relative path")
    if "\x00" in value:
        refuse("must not contain NUL")
    if "\\" in value:
        refuse('must use "/" between segments, not "\\"')
    if value.startswith("/"):
        refuse("must be relative, not absolute")
    for segment in value.split("/"):
        if segment == "":
            refuse('must not have empty segments ("//" or a trailing "/")')
        if segment in (".", ".."):
            refuse('must not contain "." or ".." segments')


def _https(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if value is None:
        return
    _text(4096)(_instance, attribute, value)
    if not value.startswith("https://") or len(value) == len("https://"):
        raise FieldError(
            attribute.name, f"must be an https:// URL (plain HTTP is refused), got {_shown(value)}"
        )


@attrs.frozen(kw_only=True)
class ModelSource:
    """Where a model came from on a public hub, for provenance.

    :ivar repository: the hub repository, such as ``HuggingFaceTB/SmolLM2-135M-Instruct``.
    :ivar revision: the commit or tag the files were taken from.
    """

    repository: str = attrs.field(validator=_text())
    revision: str = attrs.field(validator=_text())


@attrs.frozen(kw_only=True)
class ModelFile:
    """One file of a model, verified by size and sha256 before it is published.

    :ivar path: relative POSIX path inside the model (``"model.gguf"``,
        ``"tokenizer/vocab.json"``): not absolute, no empty, ``.`` or ``..``
        segments, no backslashes, no NUL.
    :ivar size: the exact size in bytes (0 to 2^53 - 1).
    :ivar sha256: 64 lowercase hexadecimal digits (no ``sha256:`` prefix).
    :ivar url: where acquisition downloads it from; ``https://`` only. Absent for
        files that arrive by upload.
    """

    path: str = attrs.field(validator=_relative_path)
    size: int = integer(0, MAX_SAFE_INTEGER)
    sha256: str = attrs.field(validator=_matches(SHA256_PATTERN, "64 lowercase hexadecimal digits"))
    url: str | None = attrs.field(default=None, validator=_https)


def gguf_split_part(path: str) -> tuple[str, int, int] | None:
    """``(prefix, number, count)`` if ``path`` names a part of a split GGUF, else None."""
    match = GGUF_SPLIT_PATTERN.fullmatch(path)
    if match is None:
        return None
    number, count = int(match["number"]), int(match["count"])
    return (match["prefix"], number, count) if 1 <= number <= count else None


def gguf_split_parts(paths: "list[str] | tuple[str, ...]") -> list[str] | None:
    """``paths`` in part order if they are every part of one split GGUF, else None.

    Every path must be ``<prefix>-<number>-of-<count>.gguf`` with one prefix and
    one count, and the numbers exactly 1 to count: llama.cpp opens the first part
    and finds the others beside it by these names.
    """
    parts = [gguf_split_part(path) for path in paths]
    if not paths or None in parts:
        return None
    prefixes = {(part[0], part[2]) for part in parts if part is not None}
    if len(prefixes) != 1:
        return None
    [(_prefix, count)] = prefixes
    numbered = sorted(zip((part[1] for part in parts if part is not None), paths, strict=True))
    if [number for number, _path in numbered] != list(range(1, count + 1)):
        return None
    return [path for _number, path in numbered]


def _files(instance: Any, attribute: "attrs.Attribute[Any]", files: Any) -> None:
    _items(ModelFile, non_empty=True, noun="file")(instance, attribute, files)
    seen: set[str] = set()
    for index, file in enumerate(files):
        if file.path in seen:
            raise FieldError(
                f"files[{index}].path", f"repeats {_shown(file.path)}; list each file once"
            )
        seen.add(file.path)
    if instance.format == "gguf":
        weights = [file.path for file in files if file.path.endswith(".gguf")]
        # One file, unless its name says it is one part of several.
        single = len(weights) == 1 and (gguf_split_part(weights[0]) or ("", 1, 1))[2] == 1
        if not single and gguf_split_parts(weights) is None:
            raise FieldError(
                "files",
                f'must hold exactly one ".gguf" file for format "gguf", or every part of '
                f"one split GGUF (<name>-00001-of-0000N.gguf ...), found {len(weights)}",
            )
    elif "config.json" not in seen:
        raise FieldError(
            "files", 'must include "config.json" at the top level for format "hf-directory"'
        )


@attrs.frozen(kw_only=True)
class ModelManifest:
    """The immutable description of a model in the registry.

    :ivar name: a display name for operators (not an identifier; any text).
    :ivar format: ``"gguf"`` (exactly one ``.gguf`` file, which llama.cpp and Ollama
        load, or every part of one split GGUF, which llama.cpp loads) or
        ``"hf-directory"`` (a Hugging Face directory with ``config.json``, which vLLM
        loads).
    :ivar licence: the model's licence as its publisher names it, if known.
    :ivar source: the hub repository and revision it came from, if any.
    :ivar files: every file, at least one, each path once.
    """

    name: str = attrs.field(validator=_text())
    format: ModelFormat = attrs.field(validator=_one_of("gguf", "hf-directory"))
    files: tuple[ModelFile, ...] = attrs.field(converter=_as_tuple, validator=_files)
    licence: str | None = attrs.field(default=None, validator=_optional(_text()))
    source: ModelSource | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(ModelSource))
    )

    @classmethod
    def gguf(
        cls,
        name: str,
        file: ModelFile,
        *,
        licence: str | None = None,
        source: ModelSource | None = None,
    ) -> "ModelManifest":
        """Describe a single-file GGUF model."""
        return cls(name=name, format="gguf", files=(file,), licence=licence, source=source)

    @classmethod
    def hf_directory(
        cls,
        name: str,
        files: "tuple[ModelFile, ...] | list[ModelFile]",
        *,
        licence: str | None = None,
        source: ModelSource | None = None,
    ) -> "ModelManifest":
        """Describe a Hugging Face-format directory (it must include ``config.json``)."""
        return cls(name=name, format="hf-directory", files=files, licence=licence, source=source)

    @property
    def weights(self) -> "tuple[ModelFile, ...]":
        """A GGUF model's ``.gguf`` files in load order; empty for other formats.

        One file, or the parts of a split GGUF by part number: an engine is handed
        the first, with the others beside it under their own names.
        """
        if self.format != "gguf":
            return ()
        by_path = {file.path: file for file in self.files if file.path.endswith(".gguf")}
        order = gguf_split_parts(list(by_path)) if len(by_path) > 1 else list(by_path)
        return tuple(by_path[path] for path in order or ())

    @property
    def size(self) -> int:
        """The total size of every file, in bytes."""
        return sum(file.size for file in self.files)

    def digest(self) -> str:
        """Return ``sha256:<hex>`` of the canonical JSON: equal manifests, equal digests."""
        return _digest(self)


@attrs.frozen(kw_only=True)
class ModelMetadata:
    """What is known of a model's semantics, read from its files (a GGUF header, say).

    Adapters use it to decide capabilities (``embedding``) and defaults
    (``context_length``); every field is optional because not every format says.
    """

    architecture: str | None = attrs.field(default=None, validator=_optional(_text()))
    context_length: int | None = integer(1, MAX_SAFE_INTEGER, default=None)
    parameter_count: int | None = integer(0, MAX_SAFE_INTEGER, default=None)
    quantisation: str | None = attrs.field(default=None, validator=_optional(_text()))
    chat_template: bool = False
    embedding: bool = False


@attrs.frozen(kw_only=True)
class ModelRecord:
    """The model an adapter translates for: what the registry holds, at one revision.

    :ivar id: the registry's model id.
    :ivar revision: the manifest digest; a workload records it as ``model_revision``.
    :ivar manifest: the immutable manifest (files, format, licence, source).
    :ivar metadata: what the files say about the model, when known.
    """

    id: str = attrs.field(validator=_text())
    revision: str = attrs.field(validator=_text())
    manifest: ModelManifest
    metadata: ModelMetadata = attrs.field(factory=ModelMetadata)
