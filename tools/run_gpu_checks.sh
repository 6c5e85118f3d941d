#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one command, for a lent GPU machine (torch, transformers and sklearn
# there; Ray, Optuna and MLflow are not needed): populations against one-seed trials, the fine-tuning loop against
# a plain PyTorch loop, and the loss kernels. Each benchmark's output is also written to $OUT (default /tmp/gpu).
#   bash tools/run_gpu_checks.sh                 # about 5 minutes on one H100/H200
set -u
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/gpu}
mkdir -p "$OUT"
if ! python3 -c "import entmax" 2>/dev/null; then  # the wheel, carried in .whl (no registry on such a machine)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # bench_losses.py imports tune_as from the checkout
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
run() { local name=$1; shift; echo "## $name: $*"; timeout 240 python3 "$@" 2>&1 | tee "$OUT/$name.txt"; }
run population_fp32 benchmarks/bench_population.py --device cuda --sizes 1 4 10 16 64 --repeats 2
run population_bf16 benchmarks/bench_population.py --device cuda --sizes 1 10 64 --repeats 2 --precision bf16 \
  --losses softmax
run finetune_loop benchmarks/bench_finetune_loop.py --device cuda --rows 4096 --repeats 3
run losses benchmarks/bench_losses.py --device cuda
run losses_multilabel benchmarks/bench_losses.py --device cuda --multilabel
