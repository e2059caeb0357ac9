"""Model files for tests: the SmolLM2 GGUF turned into an embedding model."""

from __future__ import annotations

from pathlib import Path


def with_mean_pooling(source: Path, target: Path) -> None:
    """Write ``source``'s GGUF to ``target`` with ``<arch>.pooling_type`` = mean.

    A chat model declares no pooling, and llama.cpp's ``/v1/embeddings`` refuses
    pooling "none"; dedicated embedding GGUFs carry that key. Same weights, plus it.
    Needs the ``gguf`` package (a test dependency).
    """
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch=architecture, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
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
