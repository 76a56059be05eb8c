#!/usr/bin/env bash
# GPU checks and measurements on the lent H200 with the vLLM 0.26 bundle.
# After staging the bundle (../shared/device/build-vllm-gpu-bundle.sh, two device calls):
#   bash benchmarks/gpu/run_h200.sh STEP [STEP ...]
# Steps: kernels (Triton tests compiled), tests (GPU engine tests), bandwidth, ttft (Llama-3.1-8B,
# MP=1 all k, MP=0 k=0,50), throughput (Llama-3.1-8B), qwen3 (TTFT Qwen3-8B), minilm (a random-init
# all-MiniLM-L6-v2 from the config/tokenizer files carried in .device/minilm: retrieval is timed with
# the real architecture, weights do not change its cost), final (TTFT of both models, MP=0, all k,
# retrieval timed on the GPU), ingest (facts/s with W in {0, 64}, both models).
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
    minilm) python3 -c "
import shutil, transformers
shutil.copytree('.device/minilm', '/tmp/minilm', dirs_exist_ok=True)
transformers.BertModel(transformers.BertConfig.from_pretrained('/tmp/minilm')).save_pretrained('/tmp/minilm')
print('random-init MiniLM in /tmp/minilm')" 2>&1 | tail -1
      INFERSCALE_TEST_EMBEDDER=/tmp/minilm python3 -m pytest tests/gpu/test_query_graphs.py -q -s -p no:cacheprovider 2>&1 | grep -E "^\[gpu|passed|failed|^E " ;;
    final)
      for m in ${MODELS:-llama-3.1-8b qwen3-8b}; do
        python3 benchmarks/ttft.py --model $m --embedder /tmp/minilm --tag h200-final --plot 2>&1 | grep -vE "$quiet" | tail -9
      done ;;
    ingest)
      for m in llama-3.1-8b qwen3-8b; do
        python3 benchmarks/ingest.py --model $m --facts 4000 --batch 512 --tag h200 2>&1 | grep -vE "$quiet" | tail -3
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
