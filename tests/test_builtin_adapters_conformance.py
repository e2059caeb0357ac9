"""Every installed built-in adapter passes the adapter conformance kit over a table of cases."""

from __future__ import annotations

import pytest

from ficc_core.plugins import build_plugin_manager
from ficc_core.testing import check_adapter, make_case

GIB = 1024**3


def gguf(engine: str, executable: str, *, tensor_split: bool = True) -> list:
    return [
        make_case(engine, image_executable=executable, name="gguf on CPU"),
        make_case(
            engine,
            image_executable=executable,
            context=8192,
            concurrency=4,
            gpu_memory_bytes=[8 * GIB, 8 * GIB],
            gpu_layers=99,
            tensor_split=[3, 1] if tensor_split else None,
            name="gguf on two GPUs" + (", split 3:1" if tensor_split else ""),
        ),
        make_case(engine, image_executable=executable, embedding=True, name="gguf embedding"),
    ]


def hf_directory(engine: str, executable: str) -> list:
    return [
        make_case(engine, model_format="hf-directory", image_executable=executable, name="hf"),
        make_case(
            engine,
            model_format="hf-directory",
            image_executable=executable,
            context=16384,
            concurrency=8,
            gpu_memory_bytes=[20 * GIB, 20 * GIB],
            parallelism=2,
            name="hf, tensor parallel over two GPUs",
        ),
        make_case(
            engine,
            model_format="hf-directory",
            image_executable=executable,
            embedding=True,
            name="hf embedding",
        ),
    ]


#: The engines FICC ships adapters for, with the cases each one's model format calls for.
BUILTIN_CASES = {
    "llama_cpp": gguf("llama_cpp", "llama-server"),
    # Ollama spreads layers across GPUs itself and refuses a tensor split.
    "ollama": gguf("ollama", "ollama", tensor_split=False),
    "vllm": hf_directory("vllm", "vllm"),
}


@pytest.mark.parametrize("engine", sorted(BUILTIN_CASES))
def test_builtin_adapter_passes_the_conformance_kit(engine):
    adapters = build_plugin_manager(autoload=True).adapters
    if engine not in adapters:
        pytest.skip(f"the {engine} adapter's distribution is not installed")
    # Fresh instances come from the adapter's class, as its plugin registers it.
    factory = type(adapters[engine])
    try:
        jobs = check_adapter(factory, cases=BUILTIN_CASES[engine])
    except NotImplementedError as exc:
        pytest.skip(f"the {engine} adapter does not translate yet: {exc}")
    assert len(jobs) == len(BUILTIN_CASES[engine])
