"""Model files for tests: the SmolLM2 GGUF as an embedding model, or split into parts.

Both need the ``gguf`` package (a test dependency) and keep the source's weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _architecture(gguf: Any, reader: Any) -> Any:
    """The architecture a GGUF names (every model GGUF does)."""
    field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if field is None:
        raise ValueError("the GGUF names no general.architecture")
    return field.contents()


def _copy_metadata(gguf: Any, reader: Any, writer: Any) -> None:
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # virtual fields, and the one the writer adds itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)


def with_mean_pooling(source: Path, target: Path) -> None:
    """Write ``source``'s GGUF to ``target`` with ``<arch>.pooling_type`` = mean.

    A chat model declares no pooling, and llama.cpp's ``/v1/embeddings`` refuses
    pooling "none"; dedicated embedding GGUFs carry that key. Same weights, plus it.
    """
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = _architecture(gguf, reader)
    writer = gguf.GGUFWriter(target, arch=architecture, endianess=reader.endianess)
    _copy_metadata(gguf, reader, writer)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name,
            tensor.data.shape,
            tensor.data.dtype,
            tensor.data.nbytes,
            tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def split_gguf(source: Path, folder: Path, *, parts: int, stem: str = "model") -> list[Path]:
    """Write ``source``'s GGUF as ``parts`` split GGUF files in ``folder``; return them in order.

    The ``gguf`` package's own split writer (``GGUFWriter(split_max_tensors=...)``)
    names them ``<stem>-00001-of-0000N.gguf`` ... and writes the ``split.no``,
    ``split.count`` and ``split.tensors.count`` keys llama.cpp reads: the model's
    key/value metadata in the first part, the tensors spread over all of them.
    """
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = _architecture(gguf, reader)
    per_part = -(-len(reader.tensors) // parts)
    folder.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(folder / f"{stem}.gguf", architecture, split_max_tensors=per_part)
    _copy_metadata(gguf, reader, writer)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    written = [folder / f"{stem}-{n:05d}-of-{parts:05d}.gguf" for n in range(1, parts + 1)]
    missing = [path for path in written if not path.is_file()]
    if missing:
        raise RuntimeError(f"the split writer did not write {missing}")
    return written
