#!/usr/bin/env bash
# Runs the GPU checks and measurements on the lent H200 with the vLLM 0.26 bundle.
# Usage on the device machine, after the bundle is staged (../shared/device/build-vllm-gpu-bundle.sh):
#   bash benchmarks/gpu/run_h200.sh tests|bench|all
# Results (logs, JSON) go to $OUT (or benchmarks/results when $OUT is unset).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERSCALE_CACHE=/tmp/inferscale-cache INFERSCALE_RESULTS=${OUT:-benchmarks/results}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
what=${1:-all}
python3 -c "import torch, triton, vllm; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
if [[ $what == tests || $what == all ]]; then
  [[ -n ${KERNEL_TESTS:-} ]] && TRITON_INTERPRET=0 python3 -m pytest tests/engine/kernels -q -p no:cacheprovider 2>&1 | tail -3
  python3 benchmarks/gpu/diagnose.py 2>&1 | grep -E "^==|^   " | head -40
  python3 -m pytest tests/gpu -q -s -p no:cacheprovider -o addopts="" 2>&1 | tee "$INFERSCALE_RESULTS/gpu_tests.log" | grep -E "^\[gpu|passed|failed|Error|^E " | head -60
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/kernel_bandwidth.py 2>&1 | tail -12
  python3 benchmarks/ttft.py --model llama-3.1-8b --ks ${KS:-0,10,25,50,100} --repeats ${REPEATS:-15} --embedder none --tag h200 --plot 2>&1 | grep -v -E "^\(|INFO|WARNING|Warn" | tail -14
fi
