"""The llama_cpp adapter passes the adapter conformance kit."""

from __future__ import annotations

from ficc_adapter_llama_cpp.adapter import LlamaCppAdapter

from ficc_core.testing import adapter_kit


def test_the_llama_cpp_adapter_conforms():
    gib = 1024**3
    cases = [
        adapter_kit.make_case("llama_cpp", image_executable="llama-server", name="cpu"),
        adapter_kit.make_case(
            "llama_cpp", context=2048, concurrency=8, cpus=0.5, name="eight slots, half a cpu"
        ),
        adapter_kit.make_case(
            "llama_cpp",
            image_executable="/usr/local/bin/llama-server",
            gpu_memory_bytes=(24 * gib, 24 * gib),
            gpu_layers=99,
            tensor_split=(3, 1),
            name="two gpus",
        ),
        adapter_kit.make_case("llama_cpp", embedding=True, name="embedding model"),
    ]
    jobs = adapter_kit.check_adapter(LlamaCppAdapter, cases=cases)
    chat = ("chat", "completions", "streaming", "tokenize.llama_cpp")
    assert [job.capabilities for job in jobs] == [chat] * 3 + [("embeddings",)]
