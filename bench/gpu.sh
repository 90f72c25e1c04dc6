#!/usr/bin/env bash
# CUDA qualification and benchmarks in one go (under 10 minutes on one modern GPU):
#   bash bench/gpu.sh [OUT_DIR]
# Runs the CUDA test suite, then bench/session.py on CUDA in fp32 and bf16, writing logs and JSON to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench-gpu-out}}"
mkdir -p "$out"
py="${PYTHON:-.venv/bin/python}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -m pytest -q tests/test_training_session_cuda.py 2>&1 | tee "$out/cuda_tests.txt"
"$py" bench/session.py --device cuda --repeats 2 --json "$out/session_fp32.json" 2>&1 | grep -v transformers | tee "$out/session_fp32.txt"
"$py" bench/session.py --device cuda --bf16 --repeats 2 --json "$out/session_bf16.json" 2>&1 | grep -v transformers | tee "$out/session_bf16.txt"
