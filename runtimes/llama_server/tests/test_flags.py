"""ficc-llama-server accepts exactly the llama-server flags the llama_cpp adapter emits."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ficc_llama_server.cli import common_params, parse_args

COMMAND = [sys.executable, "-m", "ficc_llama_server.cli"]
REQUIRED = ["--model", "/models/m.gguf", "--host", "/run/engine.sock"]


def _run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *flags], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--port", "8080"], "--port"),
        (["--api-key=secret"], "--api-key"),
        (["-m", "/models/other.gguf"], "-m"),
        (["--ctx"], "--ctx"),  # no abbreviations of --ctx-size either
    ],
)
def test_a_flag_the_adapter_does_not_emit_is_refused_by_name_with_status_2(flags, named):
    result = _run(*REQUIRED, *flags)
    assert result.returncode == 2
    assert f"error: {named} is not accepted" in result.stderr
    assert "--ctx-size" in result.stderr  # the message lists what is accepted


def test_a_tcp_host_is_refused_because_the_runtime_listens_on_unix_sockets_only():
    result = _run("--model", "/models/m.gguf", "--host", "127.0.0.1")
    assert result.returncode == 2
    assert "argument --host" in result.stderr
    assert "ending in .sock" in result.stderr


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--parallel", "0"], "argument --parallel: must be at least 1"),
        (["--threads", "0"], "argument --threads: must be at least 1"),
        (["--tensor-split", "1,-1"], "argument --tensor-split"),
        (["--ctx-size", "many"], "argument --ctx-size"),
    ],
)
def test_bad_values_are_refused_with_status_2(flags, problem):
    result = _run(*REQUIRED, *flags)
    assert result.returncode == 2
    assert problem in result.stderr


def test_the_model_and_the_socket_are_required():
    result = _run("--ctx-size", "512")
    assert result.returncode == 2
    assert "--model" in result.stderr and "--host" in result.stderr


def test_every_flag_maps_onto_xllamacpp_common_params():
    options = parse_args(
        [
            *REQUIRED,
            "--ctx-size", "8192",
            "--parallel", "4",
            "--threads", "3",
            "--n-gpu-layers", "99",
            "--tensor-split", "3,1",
            "--alias", "chat,chat-latest",
            "--embedding",
            "--cache-ram", "512",
            "--metrics",
            "--no-webui",
        ]
    )  # fmt: skip
    params = common_params(options)
    assert params.model.path == "/models/m.gguf"
    assert params.hostnames == ["/run/engine.sock"]
    assert params.n_ctx == 8192
    assert params.n_parallel == 4
    assert params.cpuparams.n_threads == params.cpuparams_batch.n_threads == 3
    assert params.n_gpu_layers == 99
    assert params.tensor_split[:3] == [3.0, 1.0, 0.0]
    assert params.model_alias == {"chat", "chat-latest"}
    assert params.embedding is True
    assert params.cache_ram_mib == 512
    assert params.endpoint_metrics is True
    assert params.ui is False


def test_defaults_are_llama_servers_own():
    params = common_params(parse_args(REQUIRED))
    assert params.n_ctx == 0  # from the model
    assert params.n_parallel == -1  # llama.cpp decides
    assert params.cache_ram_mib == 0  # no host prompt cache: see HOST_CACHE_MIB
    assert params.embedding is False
    assert params.endpoint_metrics is False
    assert params.ui is True


def test_embeddings_is_the_same_flag_as_embedding():
    assert parse_args([*REQUIRED, "--embeddings"]).embedding is True
