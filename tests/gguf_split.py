"""Split a real GGUF into parts with the ``gguf`` package's own split writer.

``GGUFWriter(split_max_tensors=N)`` writes ``<stem>-00001-of-0000K.gguf`` ... with
the ``split.no``, ``split.count`` and ``split.tensors.count`` keys llama.cpp reads:
the model's key/value metadata in the first part, the tensors spread over all.
"""

from __future__ import annotations

from pathlib import Path


def split_gguf(source: Path, out_dir: Path, *, parts: int, stem: str = "model") -> list[Path]:
    """Write ``source`` as ``parts`` split GGUF files under ``out_dir``; return them in order."""
    import gguf

    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    per_part = -(-len(reader.tensors) // parts)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(out_dir / f"{stem}.gguf", architecture, split_max_tensors=per_part)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # virtual fields, and the one the writer adds itself
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    written = sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))
    assert len(written) == parts, written
    return written
