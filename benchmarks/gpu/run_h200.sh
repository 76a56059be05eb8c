#!/usr/bin/env bash
# GPU checks and measurements on the lent H200 with the vLLM 0.26 bundle.
# After staging the bundle (../shared/device/build-vllm-gpu-bundle.sh, two device calls):
#   bash benchmarks/gpu/run_h200.sh STEP [STEP ...]
# Steps: kernels (Triton tests compiled), tests (GPU engine tests), bandwidth, ttft (Llama-3.1-8B,
# MP=1 all k, MP=0 k=0,50), throughput (Llama-3.1-8B), qwen3 (TTFT Qwen3-8B).
# Results (logs, JSON, PNG) go to $OUT (or benchmarks/results when $OUT is unset).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERSCALE_CACHE=/tmp/inferscale-cache INFERSCALE_RESULTS=${OUT:-benchmarks/results}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$INFERSCALE_RESULTS"
quiet='^\(|INFO|WARNING|Warn|warn|^$'
python3 -c "import torch, triton, vllm; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
for step in "$@"; do
  echo "=== $step"
  case $step in
    kernels) TRITON_INTERPRET=0 python3 -m pytest tests/engine/kernels -q -p no:cacheprovider 2>&1 | tail -3 ;;
    tests) python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee "$INFERSCALE_RESULTS/gpu_tests.log" | grep -E "^\[gpu|passed|failed|^E " | head -40 ;;
    bandwidth) python3 benchmarks/kernel_bandwidth.py 2>&1 | tail -8 ;;
    ttft)
      python3 benchmarks/ttft.py --model llama-3.1-8b --multiprocessing --embedder none --tag h200-mp1 --plot --warmup 2 2>&1 | grep -vE "$quiet" | tail -9
      python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50 --embedder none --tag h200-mp0 --warmup 2 2>&1 | grep -vE "$quiet" | tail -5 ;;
    throughput) python3 benchmarks/throughput.py --model llama-3.1-8b --multiprocessing --tag h200 --repeats 2 2>&1 | grep -vE "$quiet" | tail -8 ;;
    qwen3) python3 benchmarks/ttft.py --model qwen3-8b --multiprocessing --embedder none --tag h200-mp1 --plot --warmup 2 2>&1 | grep -vE "$quiet" | tail -9 ;;
    *) echo "unknown step $step" ;;
  esac
done
