"""Every built-in adapter over one table of cases: what it supports passes the conformance
kit; what it does not support is declared here and refused with its documented error."""

from __future__ import annotations

import pytest

from ficc_core.plugins import build_plugin_manager
from ficc_core.schema import FieldError
from ficc_core.testing import AdapterCase, check_adapter, make_case

GIB = 1024**3

#: The engines FICC ships adapters for, with the executable their runtime image runs.
EXECUTABLES = {"llama_cpp": "llama-server", "ollama": "ollama", "vllm": "vllm"}


def cases(engine: str) -> list[AdapterCase]:
    """The same cases for every engine: GGUF and Hugging Face directories, CPU and GPUs."""
    executable = EXECUTABLES[engine]
    return [
        make_case(engine, image_executable=executable, name="gguf on CPU"),
        make_case(
            engine,
            image_executable=executable,
            context=8192,
            concurrency=4,
            gpu_memory_bytes=[8 * GIB, 8 * GIB],
            gpu_layers=99,
            name="gguf on two GPUs",
        ),
        make_case(
            engine,
            image_executable=executable,
            context=8192,
            concurrency=4,
            gpu_memory_bytes=[8 * GIB, 8 * GIB],
            gpu_layers=99,
            tensor_split=[3, 1],
            name="gguf on two GPUs, split 3:1",
        ),
        make_case(engine, image_executable=executable, embedding=True, name="gguf embedding"),
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


#: What each built-in adapter does not support, by case: the error class its docs name and
#: the field that error names (the first refused, in the adapter's order of checks). Every
#: other case must pass the kit, and a declared case that starts to translate fails too
#: (then drop it from here).
UNSUPPORTED: dict[str, dict[str, tuple[str, str]]] = {
    "llama_cpp": {
        "hf": ("LlamaCppUnsupported", "model_id"),
        "hf, tensor parallel over two GPUs": ("LlamaCppUnsupported", "model_id"),
        "hf embedding": ("LlamaCppUnsupported", "model_id"),
    },
    "ollama": {
        # Ollama spreads layers across GPUs itself.
        "gguf on two GPUs, split 3:1": ("OllamaUnsupported", "tensor_split"),
        "hf": ("OllamaUnsupported", "model_id"),
        "hf, tensor parallel over two GPUs": ("OllamaUnsupported", "parallelism"),
        "hf embedding": ("OllamaUnsupported", "model_id"),
    },
    "vllm": {
        "gguf on CPU": ("VllmUnsupported", "model_id"),
        "gguf on two GPUs": ("VllmUnsupported", "gpu_layers"),
        "gguf on two GPUs, split 3:1": ("VllmUnsupported", "tensor_split"),
        "gguf embedding": ("VllmUnsupported", "model_id"),
    },
}

TABLE = [(engine, case) for engine in sorted(EXECUTABLES) for case in cases(engine)]


def _factory(engine: str):
    adapters = build_plugin_manager(autoload=True).adapters
    # The built-ins are installed with the repository (make install): one missing is a
    # broken installation or plugin registration, not something to skip.
    assert engine in adapters, f"the {engine} adapter did not register; run make install"
    # Fresh instances come from the adapter's class, as its plugin registers it.
    return type(adapters[engine])


def test_every_declared_refusal_names_a_case_of_the_table():
    names = {case.name for _, case in TABLE}
    assert set(UNSUPPORTED) == set(EXECUTABLES)
    for engine, refused in UNSUPPORTED.items():
        assert set(refused) <= names, engine


@pytest.mark.parametrize(("engine", "case"), TABLE, ids=[f"{e}: {c.name}" for e, c in TABLE])
def test_builtin_adapter_on_a_case(engine: str, case: AdapterCase):
    factory = _factory(engine)
    refusal = UNSUPPORTED[engine].get(case.name)
    if refusal is None:
        (job,) = check_adapter(factory, cases=[case])
        assert job.argv
        return
    error, field = refusal
    try:
        case.call(factory())
    except FieldError as exc:
        assert (type(exc).__name__, exc.field) == (error, field), str(exc)
        assert exc.message
    else:
        pytest.fail(f"{engine} now translates {case.name!r}: remove it from UNSUPPORTED")
