#!/usr/bin/env bash
# The CUDA checks that fit one short GPU lease (about 9 minutes on an H200, at most 17 by the steps' limits), for a
# machine whose Python already holds CUDA PyTorch but not this project's other dependencies:
#   bash bench/gpu_lease.sh [OUT_DIR]
# With a folder .whl/ of wheels beside it (this project's dependencies but torch, for the machine's Python: made here
# by `.venv/bin/python bench/gpu_wheels.py`, carried with the device tool's `carry: [".whl"]`), they and this
# checkout (editable) are installed into that Python first, with no index.
# Then, each step under its own time limit so that a slow one cannot take the others' time, output to OUT_DIR:
#   the CUDA suite (tests/test_training_session_cuda.py: span/boundary x fp32/bf16 x full/LoRA, bitwise
#   continuation in a fresh process), bench/session.py on CUDA in fp32 and bf16, bench/flow.py's ~1 s case on CUDA
#   (one group of runs), bench/realsize.py's span model (the gliner2-base shape) on CUDA, and bench/step_loop.py
#   (blocks of consecutive steps: native, the public path, the managed path) on the ~1 s model and the base shape.
# bench/gpu.sh is the longer sweep (bench/run_all.py twice) for a machine held longer.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-bench-gpu-out}}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
steps="${STEPS:-step_loop_768 step_loop_base cuda_tests session_fp32 session_bf16 flow_1s realsize_span}"  # STEPS="flow_1s": that one only
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, its output to OUT_DIR/NAME.txt and to stdout
    local name=$1 limit=$2
    shift 2
    case " install $steps " in *" $name "*) ;; *) return 0 ;; esac
    local t0=$SECONDS
    echo "=== $name (limit ${limit} s)"
    timeout -k 5 "$limit" "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.txt"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
if [ -d .whl ]; then
    step install 90 bash -c "$py -m pip install -q --no-index --no-deps --no-compile .whl/*.whl && \
        $py -m pip install -q --no-index --no-deps --no-build-isolation -e ."
fi
"$py" -c "import torch, transformers, gliner2, prefect; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'prefect', prefect.__version__)" \
    | tee -a "$out/gpu.txt"
step step_loop_768 90 "$py" bench/step_loop.py --device cuda --shape 768x6 --block 16 --rounds 6
step step_loop_base 120 "$py" bench/step_loop.py --device cuda --shape base --block 8 --rounds 5
step cuda_tests 240 "$py" -m pytest -q -rs --durations=10 tests/test_training_session_cuda.py
step session_fp32 60 "$py" bench/session.py --device cuda --repeats 1
step session_bf16 60 "$py" bench/session.py --device cuda --bf16 --repeats 1
step flow_1s 200 "$py" bench/flow.py --device cuda --cases 1s --minutes 0.25 --repeat 1
step realsize_span 150 "$py" bench/realsize.py --device cuda --arch span --steps 2 --repeats 1
