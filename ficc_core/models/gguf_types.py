"""ggml's and llama.cpp's numbering, as the GGUF reader (:mod:`.gguf`) names it.

The tensor types with their block sizes, llama.cpp's file types, the encoder
architectures it serves as embedding models, and the attention shape that sizes a
model's KV cache.
"""

from __future__ import annotations

from typing import Any

import attrs

#: ``ggml_type`` number: (name, elements per block, bytes per block).
TENSOR_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) as llama.cpp names it.
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
}

#: Encoder architectures that llama.cpp serves as embedding models.
EMBEDDING_ARCHITECTURES = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "neo-bert",
        "t5encoder",
    }
)


@attrs.frozen(kw_only=True)
class AttentionShape:
    """What sizes a model's KV cache: its layers and attention heads (from the header).

    :ivar layers: ``{architecture}.block_count``.
    :ivar kv_heads: ``{architecture}.attention.head_count_kv`` (else ``head_count``).
    :ivar key_length: the size of one key head (``attention.key_length``, else the
        embedding length over ``head_count``); ``value_length`` likewise.
    """

    layers: int
    kv_heads: int
    key_length: int
    value_length: int

    def kv_cache_bytes(self, tokens: int, element_bytes: int = 2) -> int:
        """The K and V cache of ``tokens`` tokens at ``element_bytes`` per element (f16: 2)."""
        per_token = self.kv_heads * (self.key_length + self.value_length) * element_bytes
        return self.layers * tokens * per_token


def attention_shape(values: dict[str, Any], architecture: str) -> AttentionShape | None:
    """The attention shape a header's ``values`` give for ``architecture``, if they do."""

    def number(key: str) -> int | None:
        value = values.get(f"{architecture}.{key}")
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    layers, heads = number("block_count"), number("attention.head_count")
    embedding = number("embedding_length")
    if not architecture or layers is None or heads is None:
        return None
    default = embedding // heads if embedding else None
    key = number("attention.key_length") or default
    value = number("attention.value_length") or default
    if key is None or value is None:
        return None
    kv_heads = number("attention.head_count_kv") or heads
    return AttentionShape(layers=layers, kv_heads=kv_heads, key_length=key, value_length=value)
