"""mem0 OSS for the side-by-side (peers.py): its own virtual environment and a worker process.

mem0ai pins protobuf below 7 and vLLM needs 7, so mem0 never enters our environment: the
benchmark makes a venv of its own (default ~/.cache/inferscale/venv-mem0ai-<version>, outside
the repository), installs mem0ai there with the SAME torch, transformers and
sentence-transformers versions as ours (so its embedder computes what ours computes), and talks
to peers_mem0_worker.py in it over a pipe. Configured fully offline:
  llm          provider 'vllm' (mem0's OpenAI-compatible client) at the benchmark's server
  embedder     provider 'huggingface': all-MiniLM-L6-v2 from the local folder ours loads
  vector store qdrant in local mode (embedded, on disk); history in mem0's SQLite
mem0's optional extras stay out, as in a plain `pip install mem0ai`: spaCy (entity boosts, BM25
lemmas) and fastembed (BM25) would download models at run time, which offline cannot, so its
search is its semantic score alone. Telemetry is off (MEM0_TELEMETRY=false).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import IO, Any

MEM0_VERSION = "2.2.1"
WORKER = Path(__file__).resolve().parent / "peers_mem0_worker.py"
TWINS = ("torch", "transformers", "sentence-transformers")
"""Packages installed next to mem0ai at the versions our environment has (the same embedder)."""


def default_venv() -> Path:
    """Where the venv lives: $INFERSCALE_CACHE or ~/.cache/inferscale (reused across runs)."""
    cache = Path(os.environ.get("INFERSCALE_CACHE", Path.home() / ".cache" / "inferscale"))
    return cache / f"venv-mem0ai-{MEM0_VERSION}"


def requirements() -> list[str]:
    """mem0ai and our versions of the embedder's packages."""
    return [f"mem0ai=={MEM0_VERSION}", *(f"{name}=={metadata.version(name)}" for name in TWINS)]


def _clean_env(**extra: str) -> dict[str, str]:
    """Our environment without what would leak our packages into mem0's interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def ensure_venv(venv: Path) -> Path:
    """The venv's python, made (once) with mem0ai and its twins; installed versions checked.

    Raises:
        SystemExit: the venv could not be made or holds other versions.
    """
    python = venv / "bin" / "python"
    wanted = requirements()
    check = ("import sys; from importlib.metadata import version; "
             "sys.exit(any(version(r.split('==')[0]) != r.split('==')[1] for r in sys.argv[1:]))")
    if python.exists() and subprocess.run([str(python), "-c", check, *wanted], env=_clean_env(),
                                          capture_output=True).returncode == 0:
        return python
    print(f"making mem0's venv at {venv}: {' '.join(wanted)} (a few minutes, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted],
                          env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip could not install {wanted} into {venv}:\n{done.stderr[-3000:]}\n"
                         "pass --mem0-venv to use another folder, or delete this one")
    return python


def mem0_config(workdir: Path, collection: str, *, base_url: str, model: str,
                embedder_path: str, max_tokens: int | None) -> dict[str, Any]:
    """Memory.from_config's dict: the benchmark's served model, local MiniLM, local qdrant."""
    llm: dict[str, Any] = {"model": model, "vllm_base_url": f"{base_url}/v1",
                           "api_key": "unused"}
    if max_tokens is not None:
        llm["max_tokens"] = max_tokens
    return {
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": collection, "path": str(workdir / "qdrant"),
            "embedding_model_dims": 384, "on_disk": True}},
        "llm": {"provider": "vllm", "config": llm},
        "embedder": {"provider": "huggingface", "config": {"model": embedder_path,
                                                           "embedding_dims": 384}},
        "history_db_path": str(workdir / "history.db"),
    }


class Mem0Worker:
    """peers_mem0_worker.py in mem0's venv: call(op, ...) -> its reply (a dict)."""

    def __init__(self, python: Path, workdir: Path, pythonpath: str | None = None) -> None:
        """pythonpath: where `python` finds mem0ai, when it is not a venv of its own."""
        workdir.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(workdir / "worker.log", "ab")  # noqa: SIM115 - closed in close()
        env = _clean_env(MEM0_TELEMETRY="false", MEM0_DIR=str(workdir / ".mem0"),
                         HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                         TOKENIZERS_PARALLELISM="false",
                         **({"PYTHONPATH": pythonpath} if pythonpath else {}))
        self._process = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, env=env,
                                         text=True, bufsize=1)
        self.log_path = workdir / "worker.log"

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request; the worker's reply. A dead worker raises (with its log's tail)."""
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"mem0's worker died during {op!r}:\n{tail}")
        return json.loads(line)

    def kill(self) -> None:
        """End the worker now (a call in flight in another thread then raises)."""
        if self._process.poll() is None:
            self._process.kill()

    def close(self) -> None:
        """Ask the worker to exit; kill it if it is still busy (an add in flight) after 30 s."""
        if self._process.poll() is None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(json.dumps({"op": "close"}) + "\n")
                self._process.stdin.flush()
            except OSError:
                pass
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
