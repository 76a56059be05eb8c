#!/usr/bin/env bash
# GPU checks and measurements on the lent H200 with the vLLM 0.26 bundle.
# After staging the bundle (../shared/device/build-vllm-gpu-bundle.sh; benchmarks/gpu/stage_bundle.sh
# --split N carries it in N device calls):
#   bash benchmarks/gpu/run_h200.sh STEP [STEP ...]
# Steps: kernels (Triton tests compiled), overlap (benchmarks/gpu/overlap_probe.py), tests (GPU engine tests; BLOCK_SIZE=64 runs them with
# vLLM blocks of 64 tokens), bandwidth, ttft (Llama-3.1-8B,
# MP=1 all k, MP=0 k=0,50), throughput (Llama-3.1-8B), qwen3 (TTFT Qwen3-8B), minilm (a random-init
# all-MiniLM-L6-v2 from the config/tokenizer files carried in .device/minilm: retrieval is timed with
# the real architecture, weights do not change its cost), final (TTFT of both models, MP=0, all k,
# retrieval timed on the GPU), ingest (facts/s with W 0/64/256, alone and in runs of 512 fact tokens, both models), families (same-
# position exactness and moved keys on Phi-4-mini, Gemma-3-12B, Qwen3-30B-A3B and Mixtral-8x7B
# configs, dummy weights, one process each), families_ttft (ttft.py at k=50 for each of them),
# server (TTFT of `inferscale serve` over HTTP vs in-process, Llama-3.1-8B, k=50), ceiling (issue 13:
# ttft.py for Llama-3.1-8B with the LoCoMo arms' layouts (kv-userR, text-userR) at k=0..100 incl.
# 20, and Qwen3-8B, MP=0, retrieval timed on the GPU), async (the same with vLLM's
# async_scheduling, Llama, k=0,50,100), profile (cProfile of kv and resident at k=100), memory1m (memory_ops.py: 1M facts of one user, index and
# query embedder on the GPU), ceiling2 (the issue-13 TTFT table: both models, k=0..100, with
# retrieval), ttft_llama (the same without retrieval, Llama only; MODELS= for others), fullgraph (ttft.py with cudagraph_mode FULL, Llama, k=0,50,100), probe
# (ceiling_probe.py, per-phase medians at k=50,100), peers (benchmarks/peers.py latency columns; carry .whl, .device/uv, .device/minilm, .device/locomo), search_latency (retrieval_locomo.py
# --latency-only: vector vs hybrid search at 1k/100k/1M facts on the GPU and on this host's CPU; KEYWORD_CONTEXT=1 with keyword context;
# needs no vLLM bundle, only .device/minilm and .device/locomo/locomo10.json), throughput_async (throughput.py through
# vLLM's AsyncLLM), probe_batch (ceiling_probe.py --batch 64 at k=50: host time per throughput
# prefill batch; BLOCK_SIZE=64 for vLLM blocks of 64 tokens), timeline (the same with 16-token
# answers: every engine step of whole throughput batches, N=${N:-64}), tail (throughput at N=64,
# 10 repeats, MP=1 and MP=0: where the decode tail of a batch goes), client (cProfile of the
# client process during throughput batches at N=64, vLLM's stats on and off), throughput_mp0 (N=32,64 with MP=0;
# BLOCK_SIZE too), sync (async (default) vs sync scheduling: ttft.py with async_scheduling=false),
# bs64 (ttft.py with vLLM blocks of 64 tokens), probe_bs (ceiling_probe at k=50,100 with blocks of
# 16 and 64 tokens), search_probe (search phases at 10k/100k/300k/1M facts, float32 vs float16 scan), throughput (k=50, N up to 128, text / kv / resident, MP=1), aligned (kv vs resident, fact sets
# ending on a block boundary and not; DRAWS, MODES, BLOCK_SIZE), floor (floor_probe.py: TTFT of kv
# with the plan check, the load or both switched off, vs resident; MODELS, KS, VARIANTS), tp2
# (kind nvidia-h200-x2: the TP=2 invariants, ttft.py and throughput.py at TP=2, tagged tp2),
# tiers (benchmarks/tiers.py: tiered fact KV at 10x the slab, vLLM's CPU offloading beside it), promote (host-tier promotion vs the host link), serve_overhead (plain `vllm serve`,
# the same with a no-op connector, `inferscale serve`, over HTTP, memory off / text / kv at k=50; needs .device/uv and .device/minilm), fp8 (ttft.py with an fp8 KV
# cache), ab_old (ttft.py of this tree vs
# another commit's carried in .device/old, alternating).
# FAMILY_MODELS picks a subset of the families, e.g. FAMILY_MODELS="qwen3-30b-a3b mixtral-8x7b".
# The MoE families need vLLM 0.26's _moe_C_stable_libtorch.abi3.so, which the bundle drops. Pack
# it once (40 MiB) and carry .device/moe with the first families command (after the bundle's):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 -d /tmp/w vllm==0.26.0
#   mkdir -p .device/moe && unzip -p /tmp/w/vllm-0.26.0-*.whl vllm/_moe_C_stable_libtorch.abi3.so \
#     | xz -6 > .device/moe/_moe_C_stable_libtorch.abi3.so.xz
# minilm and server need .device/minilm: the all-MiniLM-L6-v2 folder without model.safetensors.
# Results (logs, JSON, PNG) go to $OUT (or benchmarks/out when $OUT is unset).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERSCALE_CACHE=/tmp/inferscale-cache INFERSCALE_RESULTS=${OUT:-benchmarks/out}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$INFERSCALE_RESULTS"
quiet='^\(|INFO|WARNING|Warn|warn|^$'
families=${FAMILY_MODELS:-phi-4-mini gemma-3-12b qwen3-30b-a3b mixtral-8x7b}
graphs=${GRAPHS:-1,2,4,8,16,32,64,128}  # CUDA graphs of families_ttft / server: a kv prefill is ~50 tokens
stage_moe() {  # unpack .device/moe into the bundle's vllm/ (once per machine)
  local dir
  dir=$(python3 -c "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])")
  [ -f "$dir/_moe_C_stable_libtorch.abi3.so" ] && return 0
  [ -f .device/moe/_moe_C_stable_libtorch.abi3.so.xz ] || {
    echo "MoE kernels missing: carry .device/moe (see the header)"; return 1; }
  python3 - "$dir/_moe_C_stable_libtorch.abi3.so" <<'P'
import hashlib, lzma, os, pathlib, sys
data = lzma.open(".device/moe/_moe_C_stable_libtorch.abi3.so.xz").read()
sums = pathlib.Path(".device/moe/SHA256SUMS")
if sums.exists() and hashlib.sha256(data).hexdigest() != sums.read_text().split()[0]:
    sys.exit("_moe_C_stable_libtorch.abi3.so: sha256 mismatch")
pathlib.Path(sys.argv[1] + ".tmp").write_bytes(data)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("staged vLLM's MoE kernels")
P
}
random_minilm() {  # a random-init all-MiniLM-L6-v2 in /tmp/minilm (cost is the architecture's)
  [ -f /tmp/minilm/model.safetensors ] && return 0
  python3 -c "
import shutil, transformers
shutil.copytree('.device/minilm', '/tmp/minilm', dirs_exist_ok=True)
transformers.BertModel(transformers.BertConfig.from_pretrained('/tmp/minilm')).save_pretrained('/tmp/minilm')
print('random-init MiniLM in /tmp/minilm')" 2>&1 | tail -1
}
# records are tagged with the card they ran on (h100 / h200), whatever this script's name
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(0); print('h100' if 'H100' in n else 'h200' if 'H200' in n else 'gpu')")
python3 -c "import torch, triton, vllm; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
for step in "$@"; do
  echo "=== $step"
  case $step in
    kernels) TRITON_INTERPRET=0 python3 -m pytest tests/engine/kernels -q -p no:cacheprovider 2>&1 | tail -3 ;;
    tests) INFERSCALE_TEST_BLOCK_SIZE=${BLOCK_SIZE:-} python3 -m pytest tests/gpu -q -s -p no:cacheprovider --ignore=tests/gpu/test_gpu_families.py 2>&1 | tee "$INFERSCALE_RESULTS/gpu_tests.log" | grep -E "^\[gpu|passed|failed|^E " | head -40 ;;
    bandwidth)  # ${TOKENS}: injected tokens per step (k=10 / 50 / 100 of 30-token facts)
      for t in ${TOKENS:-300 1500 3000}; do echo "== $t tokens"
        python3 benchmarks/kernel_bandwidth.py --num-tokens $t --fact-tokens 30 2>&1 | grep -E "GB/s|host time|wrote"
      done ;;
    overlap)  # can the injection copy hide behind a prefill's GEMMs on a side stream? (no vLLM)
      python3 benchmarks/gpu/overlap_probe.py --reps 15 2>&1 | tail -10
      python3 benchmarks/gpu/overlap_probe.py --reps 15 --inject-tokens 160000 --tokens 7300 --groups 4,8,32 --tag n128 2>&1 | tail -6 ;;
    ttft)
      python3 benchmarks/ttft.py --model llama-3.1-8b --multiprocessing --embedder none --tag $gpu-mp1 --plot --warmup 2 2>&1 | grep -vE "$quiet" | tail -9
      python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50 --embedder none --tag $gpu-mp0 --warmup 2 2>&1 | grep -vE "$quiet" | tail -5 ;;
    client)  # where the client's time per throughput batch goes: cProfile at N=64, vLLM stats on, then off
      for stats in false true; do
        python3 benchmarks/throughput.py --model llama-3.1-8b --multiprocessing --tag $gpu-client-nostats-$stats --concurrency 64 --repeats ${REPEATS:-4} --profile-client --vllm-arg disable_log_stats=$stats 2>&1 | grep -vE "$quiet" | tail -8
      done ;;
    aligned)  # kv vs resident with each request's preamble + facts ending on a block boundary
      # (resident then computes exactly the tokens kv computes), next to the unaligned draw
      # (DRAWS, MODES; BLOCK_SIZE=64 for vLLM blocks of 64 tokens, the draw aligned to them)
      for a in ${DRAWS:-unaligned aligned}; do
        timeout ${TIMEOUT:-280} python3 benchmarks/throughput.py --model llama-3.1-8b --multiprocessing --modes ${MODES:-kv,resident} --concurrency ${CONC:-32,64,128} --repeats ${REPEATS:-6} --tag $gpu-$a${BLOCK_SIZE:+-bs$BLOCK_SIZE} $([ $a = aligned ] && echo --align-blocks) ${BLOCK_SIZE:+--vllm-arg block_size=$BLOCK_SIZE} 2>&1 | grep -vE "$quiet" | tail -8
      done ;;
    floor)  # the connector API's floor: kv with our per-request work removed piece by piece
      for m in ${MODELS:-llama-3.1-8b}; do
        timeout ${TIMEOUT:-400} python3 benchmarks/gpu/floor_probe.py --model $m --k ${KS:-0,25,50,100} --requests ${REPEATS:-25} ${VARIANTS:+--variants $VARIANTS} --tag $gpu 2>&1 | grep -vE "$quiet" | grep -E "^\||^==|WARN|wrote"
      done ;;
    throughput) python3 benchmarks/throughput.py --model llama-3.1-8b --multiprocessing --tag $gpu --concurrency 1,8,32,64,128 --repeats ${REPEATS:-6} 2>&1 | grep -vE "$quiet" | tail -12 ;;
    ceiling) random_minilm
      python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,10,20,25,50,100 --modes text,kv,resident,kv-user2,kv-user4,text-user2,text-user4 --embedder /tmp/minilm --tag $gpu-ceiling --plot --warmup 4 2>&1 | grep -vE "$quiet" | tail -12
      python3 benchmarks/ttft.py --model qwen3-8b --ks 0,10,25,50,100 --embedder /tmp/minilm --tag $gpu-ceiling --plot --warmup 4 2>&1 | grep -vE "$quiet" | tail -9 ;;
    profile)  # cProfile of kv and of resident requests at k=100 (timings distorted: read the tops)
      python3 benchmarks/ttft.py --model llama-3.1-8b --ks 100 --modes kv,resident --embedder none --tag $gpu-profile --warmup 4 --profile 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/profile.log"; tail -4 "$INFERSCALE_RESULTS/profile.log" ;;
    ceiling2)  # issue 13 "must show": both models, k=0..100, 15 timed requests per point
      random_minilm
      python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,10,25,50,100 --modes text,kv,resident,kv-user2 --embedder /tmp/minilm --tag $gpu-ceiling2 --plot --warmup 4 2>&1 | grep -vE "$quiet" | tail -9
      python3 benchmarks/ttft.py --model qwen3-8b --ks 0,10,25,50,100 --embedder /tmp/minilm --tag $gpu-ceiling2 --plot --warmup 4 2>&1 | grep -vE "$quiet" | tail -9 ;;
    ttft_llama)  # the issue-13 TTFT table for Llama-3.1-8B only (no retrieval timing), MODELS overrides
      # (KS, TAG; EXTRA: more ttft.py arguments, e.g. --predecessor mixed or --facts locomo).
      # Synthetic 30-token facts unless EXTRA says otherwise, also where LoCoMo data was carried
      # (the pooled history is synthetic; 2026-12-04 two runs took LoCoMo by mistake)
      for m in ${MODELS:-llama-3.1-8b}; do
        timeout 400 python3 benchmarks/ttft.py --model $m --ks ${KS:-0,10,25,50,100} --embedder none --tag $gpu-${TAG:-fair} --plot --warmup 4 --facts synthetic ${EXTRA:-} 2>&1 | grep -vE "$quiet" | tail -9
      done ;;
    fullgraph)  # vLLM's FULL CUDA graphs for mixed batches too (FA3 supports them), every mode
      timeout 500 python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50,100 --embedder none --tag $gpu-fullgraph --warmup 4 --vllm-arg 'compilation_config={"cudagraph_mode": "FULL"}' 2>&1 | grep -vE "$quiet" | tail -6 ;;
    probe)  # per-phase host time of kv vs resident (medians per request) + profiler tops
      timeout 400 python3 benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50,100 --requests 20 --profiled 2 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/probe.log"; grep -A40 "== .*k=" "$INFERSCALE_RESULTS/probe.log" | grep -E "==|connector|planner|schedule |execute_model|sample" ;;
    probe_variants)  # the same at k=100 under process settings: gc frozen / off, 1 torch thread
      timeout 500 python3 benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 100 --requests 20 --profiled 0 --variants default,gc-frozen,gc-off,threads1 --tag variants 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/probe_variants.log"; grep -A40 "== " "$INFERSCALE_RESULTS/probe_variants.log" | grep -E "==|_verify|_load_indices|upload|inject_|planner.plan|planner.build|allocate_slots|cache_full|execute_model" ;;
    probe_batch)  # issue 13 at N=64: host time per batch of 64 one-token requests, kv vs resident
      # (BLOCK_SIZE=64 for vLLM blocks of 64 tokens: a quarter of the per-block bookkeeping)
      timeout 500 python3 benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50 --batch 64 --requests 6 --profiled 0 --max-model-len 4096 --slab-mib 8192 ${BLOCK_SIZE:+--block-size $BLOCK_SIZE} --tag batch64${BLOCK_SIZE:+-bs$BLOCK_SIZE} 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/probe_batch${BLOCK_SIZE:+-bs$BLOCK_SIZE}.log"; grep -A40 "== " "$INFERSCALE_RESULTS/probe_batch${BLOCK_SIZE:+-bs$BLOCK_SIZE}.log" | grep -E "==|schedule |allocate|cache_full|computed_blocks|_verify|execute|start_load|prepare|planner.plan|runner" ;;
    timeline)  # issue 13 at N=64: every engine step of whole throughput batches (16 tokens), kv vs resident
      timeout 400 python3 benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50 --batch ${N:-64} --max-tokens 16 --timeline --requests 4 --profiled 0 --max-model-len 4096 --slab-mib 8192 ${BLOCK_SIZE:+--block-size $BLOCK_SIZE} --tag timeline${N:-64}${BLOCK_SIZE:+-bs$BLOCK_SIZE} 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/timeline${N:-64}.log"; grep -E "^== |^-- |^  +[0-9]|round" "$INFERSCALE_RESULTS/timeline${N:-64}.log" | head -120 ;;
    tail)  # issue 13: what swings throughput between starts. N=64, 10 timed repeats, MP=1 then
      # MP=0; each batch's engine-core first/last token vs its wall (the decode tail's split)
      timeout 280 python3 benchmarks/throughput.py --model llama-3.1-8b --multiprocessing --tag $gpu-tail-mp1 --concurrency 64 --repeats 10 2>&1 | grep -vE "$quiet" | tail -9
      timeout 280 python3 benchmarks/throughput.py --model llama-3.1-8b --tag $gpu-tail-mp0 --concurrency 64 --repeats 10 2>&1 | grep -vE "$quiet" | tail -9 ;;
    throughput_mp0)  # the throughput batches with vLLM's engine core in this process (MP=0)
      timeout 500 python3 benchmarks/throughput.py --model llama-3.1-8b --tag $gpu-mp0${BLOCK_SIZE:+-bs$BLOCK_SIZE} --concurrency 32,64 --repeats 3 ${BLOCK_SIZE:+--vllm-arg block_size=$BLOCK_SIZE} 2>&1 | grep -vE "$quiet" | tail -4 ;;
    probe_bs)  # host phases per request at k=50,100 with vLLM blocks of 16 and of 64 tokens, one start
      for bs in 16 64; do
        timeout 280 python3 benchmarks/gpu/ceiling_probe.py --model llama-3.1-8b --k 50,100 --requests 20 --profiled 0 --block-size $bs --tag bs$bs 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/probe-bs$bs.log"; grep -A40 "== " "$INFERSCALE_RESULTS/probe-bs$bs.log" | grep -E "==|allocate|cache_full|computed_blocks|schedule |execute_model|start_load|runner"
      done ;;
    sync)  # vLLM's async scheduling off (on by default in vLLM 0.26), Llama, k=0,50,100
      timeout 400 python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50,100 --embedder none --tag $gpu-sync --warmup 4 --vllm-arg async_scheduling=false 2>&1 | grep -vE "$quiet" | tail -6 ;;
    bs64)  # vLLM blocks of 64 tokens, Llama, k=0,50,100
      timeout 400 python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50,100 --embedder none --tag $gpu-bs64 --warmup 4 --block-size 64 2>&1 | grep -vE "$quiet" | tail -6 ;;
    throughput_async)  # every mode through vLLM's AsyncLLM (as `inferscale serve` runs)
      timeout 500 python3 benchmarks/throughput.py --model llama-3.1-8b --async-engine --tag $gpu-async --concurrency 1,8,32,64,128 --repeats 2 2>&1 | grep -vE "$quiet" | tail -9 ;;
    async)
      timeout 400 python3 benchmarks/ttft.py --model llama-3.1-8b --ks 0,50,100 --embedder none --tag $gpu-async --warmup 4 --vllm-arg async_scheduling=true 2>&1 | grep -vE "$quiet" | tail -8 ;;
    search_probe) random_minilm  # where a search's time goes: tokenize / embed / scan, float32 vs float16 scan
      timeout 500 python3 benchmarks/gpu/search_probe.py --device cuda --sizes 10000,100000,300000,1000000 --embedder /tmp/minilm --queries 200 --tag $gpu 2>&1 | grep -vE "$quiet" > "$INFERSCALE_RESULTS/search_probe.log"; grep -B2 -A4 "facts, k=" "$INFERSCALE_RESULTS/search_probe.log"; grep -A22 "by self_device" "$INFERSCALE_RESULTS/search_probe.log" | head -50 ;;
    search_latency) random_minilm  # issue 55's table: vector vs hybrid at 1k/100k/1M facts, GPU and this host's CPU
      for dev in ${DEVICES:-cuda cpu}; do  # the host's CPU to 100k facts (1M there outlasts the timeout)
        [ $dev = cuda ] && sizes=${SIZES:-1000,100000,1000000} || sizes=${CPU_SIZES:-1000,100000}
        timeout 280 python3 benchmarks/retrieval_locomo.py --latency-only --device $dev --embedder /tmp/minilm --data .device/locomo/locomo10.json --sizes $sizes --max-postings ${POSTINGS:-2000,10000} ${KEYWORD_CONTEXT:+--keyword-context} --queries 100 --repeats 3 --tag $gpu-$dev${KEYWORD_CONTEXT:+-context} 2>&1 | grep -E "facts|wrote|Error|error"
      done ;;
    peers)  # issue 56's latency columns: benchmarks/peers.py, Llama-3.1-8B geometry, dummy weights (no scores)
      # mem0 and LangGraph travel as wheels in .whl (pip download --no-deps for the device's platform, the
      # versions of mem0's venv and ours: mem0ai qdrant-client posthog backoff pytz sqlalchemy langgraph
      # langgraph-checkpoint langgraph-prebuilt langgraph-sdk langchain-core langchain-protocol langsmith
      # ormsgpack jsonpatch jsonpointer tenacity orjson uuid-utils zstandard requests-toolbelt websockets).
      # With the bundle split in 3 (stage_bundle.sh --split 3), back to back: carry .device/p1 and .whl and run
      # stage_bundle.sh plus `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`; carry .device/p2;
      # carry .device/p3 .device/uv .device/minilm .device/locomo and run stage_bundle.sh, then this step
      for w in .device/uv/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
      random_minilm
      # the stores (SQLite, qdrant folders) stay on the machine; the JSONL and summary come back
      MEM0_PYTHONPATH=/tmp/site INFERSCALE_RESULTS=/tmp/peers-out timeout 570 python3 benchmarks/peers.py --model llama-3.1-8b --split dev --max-questions ${QUESTIONS:-40} --data-path .device/locomo/locomo10.json --embedder /tmp/minilm --mem0-python "$(command -v python3)" --arms inferscale-kv,inferscale-text,mem0-raw,langgraph --kv-cache-gib 4 --max-model-len 8192 --slab-mib 4096 --tag $gpu 2>&1 | grep -vE "$quiet" | tail -30
      cp /tmp/peers-out/peers-*.json* "$INFERSCALE_RESULTS/" ;;
    memory1m) random_minilm
      timeout 500 python3 benchmarks/memory_ops.py --model tiny --device cuda --sizes 10000,1000000 --real-embed-up-to 0 --skip-encode --k 50 --queries 300 --batch 20000 --embedder /tmp/minilm --tag $gpu 2>&1 | grep -vE "$quiet" | tail -8 ;;
    qwen3) python3 benchmarks/ttft.py --model qwen3-8b --multiprocessing --embedder none --tag $gpu-mp1 --plot --warmup 2 2>&1 | grep -vE "$quiet" | tail -9 ;;
    minilm) random_minilm
      INFERSCALE_TEST_EMBEDDER=/tmp/minilm python3 -m pytest tests/gpu/test_query_graphs.py -q -s -p no:cacheprovider 2>&1 | grep -E "^\[gpu|passed|failed|^E " ;;
    final)
      for m in ${MODELS:-llama-3.1-8b qwen3-8b}; do
        python3 benchmarks/ttft.py --model $m --embedder /tmp/minilm --tag $gpu-final --plot 2>&1 | grep -vE "$quiet" | tail -9
      done ;;
    ingest)
      for m in llama-3.1-8b qwen3-8b; do
        python3 benchmarks/ingest.py --model $m --facts 4000 --batch 512 --slab-mib 20480 --windows 0,64,64r512,256,256r512 --tag $gpu 2>&1 | grep -vE "$quiet" | tail -6
      done ;;
    families)
      stage_moe || echo "(Mixtral / Qwen3-MoE will fail without them)"
      for m in $families; do
        timeout 420 python3 -m pytest "tests/gpu/test_gpu_families.py::test_family[$m]" -q -s -p no:cacheprovider 2>&1 | tee -a "$INFERSCALE_RESULTS/gpu_families.log" | grep -E "^\[gpu|passed|failed|^E " | head -12
      done ;;
    families_ttft)
      stage_moe || echo "(Mixtral / Qwen3-MoE will fail without them)"
      for m in $families; do
        timeout 420 python3 benchmarks/ttft.py --model $m --ks 50 --embedder none --tag $gpu-family --warmup 3 --repeats 10 --slab-mib 6144 --cudagraph-sizes $graphs 2>&1 | grep -vE "$quiet" | tail -4
      done ;;
    server)
      # The bundle lacks the HTTP server's pure-Python deps (uvicorn, h11, click, jmespath,
      # supervisor); carry their wheels in .device/uv (pip download --no-deps --only-binary=:all:
      # uvicorn h11 click jmespath supervisor -d .device/uv).
      for w in .device/uv/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
      random_minilm
      timeout 590 python3 benchmarks/server_ttft.py --model llama-3.1-8b --embedder /tmp/minilm --tag $gpu --cudagraph-sizes $graphs 2>&1 | grep -vE "$quiet" | tail -12 ;;
    serve_overhead)  # issue 46: plain `vllm serve` vs `inferscale serve`, TTFT over HTTP, paired
      for w in .device/uv/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
      random_minilm
      # three servers share the GPU (plain, no-op connector, ours): a quarter of it each + our slab
      timeout 590 python3 benchmarks/serve_overhead.py --model llama-3.1-8b --embedder /tmp/minilm --k ${K:-50} --requests ${REQUESTS:-30} --slab-mib ${SLAB_MIB:-7680} --gpu-memory-utilization ${GPU_UTIL:-0.25} --tag $gpu --cudagraph-sizes $graphs 2>&1 | grep -vE "$quiet" | tail -24 ;;
    tp2)  # needs nvidia-h200-x2; TP settings that started on 2 H200s (notes/environment.md)
      export VLLM_ALLREDUCE_USE_SYMM_MEM=0
      timeout 400 python3 -m pytest tests/invariants/test_tensor_parallel.py -q -s -p no:cacheprovider 2>&1 | grep -E "TP=2|passed|failed|^E " | head -12
      timeout 400 python3 benchmarks/ttft.py --model llama-3.1-8b --tensor-parallel-size 2 --ks 0,25,50,100 --embedder none --warmup 4 --vllm-arg disable_custom_all_reduce=true --tag $gpu-tp2 2>&1 | grep -vE "$quiet" | tail -8
      timeout 500 python3 benchmarks/throughput.py --model llama-3.1-8b --tensor-parallel-size 2 --multiprocessing --concurrency 1,8,32,64 --repeats 2 --vllm-arg disable_custom_all_reduce=true --tag $gpu-tp2 2>&1 | grep -vE "$quiet" | tail -10 ;;
    tiers)  # the tier scale benchmark: fact KV many times the slab, Zipf users, k=50, and vLLM's
      # own CPU offloading as the peer (USERS, FACTS, SLAB_MIB, HOST_MIB, REQUESTS, ARMS (all five
      # take ~12 min: split them over two calls); the disk tier writes under /tmp)
      timeout 590 python3 benchmarks/tiers.py --model llama-3.1-8b --users ${USERS:-80} --facts-per-user ${FACTS:-50} --k 50 --slab-mib ${SLAB_MIB:-1280} --host-tier-mib ${HOST_MIB:-4096} --requests ${REQUESTS:-1500} --warmup 200 --kv-cache-gib 16 --cudagraph-sizes $graphs --arms ${ARMS:-resident,host,offload,disk,reencode} --disk-folder /tmp/inferscale-tiers --plot --tag $gpu 2>&1 | grep -vE "$quiet" | tail -16 ;;
    promote)  # host-tier promotion per call vs the host link (benchmarks/gpu/promote_probe.py);
      # REFERENCE=.device/old/old_tiers.py times another version's connector/worker_tiers.py beside it
      timeout 300 python3 benchmarks/gpu/promote_probe.py --calls ${CALLS:-40} ${REFERENCE:+--reference $REFERENCE} --tag $gpu 2>&1 | grep -vE "$quiet" | tail -5 ;;
    fp8)  # TTFT text / kv / resident with vLLM's fp8 KV cache, Llama-3.1-8B, k=0..100
      timeout 400 python3 benchmarks/ttft.py --model llama-3.1-8b --kv-cache-dtype fp8 --ks ${KS:-0,25,50,100} --embedder none --warmup 4 --facts synthetic --plot --tag $gpu-fp8 2>&1 | grep -vE "$quiet" | tail -8 ;;
    ab_old)  # kv/resident at k=50,100: this tree vs OLD (a `git archive` of another commit's
      # inferscale_engine and benchmarks, e.g. 43ae860 with its run-time-compiled C helpers, in
      # .device/old), alternating old, new, new, old on one machine
      for side in old new new old; do
        dir=$PWD; [ $side = old ] && dir=$PWD/${OLD:-.device/old}
        (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 280 python3 benchmarks/ttft.py --model llama-3.1-8b --ks 50,100 --embedder none --warmup 4 --repeats ${REPEATS:-20} --facts synthetic --tag $gpu-ab-$side 2>&1 | grep -vE "$quiet" | tail -4)
      done ;;
    *) echo "unknown step $step" ;;
  esac
done
