"""The sglang adapter passes FICC's adapter conformance kit, as registered and as configured."""

from __future__ import annotations

from functools import partial

import pytest
from ficc_example_sglang import SGLangAdapter

from ficc_core.testing import check_adapter, make_case

GIB = 1024**3
CASES = [
    make_case("sglang", model_format="hf-directory", image_executable="python3"),
    make_case(
        "sglang",
        model_format="hf-directory",
        image_executable="/opt/sglang/bin/python",
        context=32768,
        concurrency=32,
        gpu_memory_bytes=[40 * GIB, 40 * GIB],
        parallelism=2,
    ),
    make_case("sglang", model_format="hf-directory", embedding=True, gpu_memory_bytes=[GIB]),
]


@pytest.mark.parametrize(
    "factory",
    [SGLangAdapter, partial(SGLangAdapter, device_memory_bytes=80 * GIB)],
    ids=["registered factory", "device memory known"],
)
def test_the_sglang_adapter_passes_the_conformance_kit(factory):
    jobs = check_adapter(factory, cases=CASES)
    assert len(jobs) == len(CASES)
