#!/usr/bin/env bash
# CUDA qualification and benchmarks in one go (under 10 minutes on one modern GPU):
#   bash bench/gpu.sh [OUT_DIR]
# Runs the CUDA test suite, then the session, flow and real-size (gliner2-base shape) comparisons on CUDA in fp32 and
# bf16 (bench/run_all.py), writing
# logs and one markdown table per precision to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench-gpu-out}}"
mkdir -p "$out"
py="${PYTHON:-.venv/bin/python}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -m pytest -q tests/test_training_session_cuda.py 2>&1 | tee "$out/cuda_tests.txt"
"$py" bench/run_all.py --device cuda --skip plan,chaos --flow-repeat 1 --out "$out/REPORT-cuda-fp32.md" 2>&1 | tail -40 | tee "$out/run_all_fp32.txt"
"$py" bench/run_all.py --device cuda --bf16 --skip plan,chaos,cliresume --flow-repeat 1 --out "$out/REPORT-cuda-bf16.md" 2>&1 | tail -40 | tee "$out/run_all_bf16.txt"
