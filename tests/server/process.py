"""`inferscale serve` in a child process on 127.0.0.1, for the server tests and the load benchmark.

The server runs in its own process group (vLLM's engine core and worker are its children), so
kill() takes the whole server down at once, as a crash would; the group also dies with the
process that started it (PR_SET_PDEATHSIG), so an interrupted run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]

KEYS = {
    "a": "sk-test-tenant-a-0123456789",
    "b": "sk-test-tenant-b-0123456789",
    "admin": "sk-test-admin-0123456789ab",
    "latin": "sk-test-tenant-latin-01234",
    "latin-admin": "sk-test-admin-latin-012345",
    "accent": "sk-test-tenant-accent-0123",
}
"""API keys of the test keys file: tenant a reaches users 'a:*', tenant b 'b:*', admin both;
tenant latin 'cafe*' (and its admin key), tenant accent 'café:*': the decomposed spelling
'cafe\u0301:...' starts with 'cafe' but normalizes to one of accent's users."""


def keys_file(path: Path) -> Path:
    """Write the test keys file (KEYS) to `path`."""
    path.write_text(json.dumps({"keys": {
        KEYS["a"]: {"tenant": "a", "users": ["a:*"]},
        KEYS["b"]: {"tenant": "b", "users": ["b:*"]},
        KEYS["admin"]: {"tenant": "ops", "users": ["a:*", "b:*"], "admin": True},
        KEYS["latin"]: {"tenant": "latin", "users": ["cafe*"]},
        KEYS["latin-admin"]: {"tenant": "latin", "users": ["cafe*"], "admin": True},
        KEYS["accent"]: {"tenant": "accent", "users": ["caf\u00e9:*"]}}}))
    return path


CPU_SIZING = ("--enforce-eager", "--slab-mib", "32", "--kv-cache-memory-bytes", str(128 * 2**20),
              "--max-model-len", "2048")
TEST_FLAGS = ("--max-add-facts", "200", "--enable-prompt-tokens-details")
"""Flags of the shared test server: a maximal add the fairness test can run in well under a
minute, and usage.prompt_tokens_details.cached_tokens (the prefix-cache oracle test reads it)."""
"""Sizing flags of the test server (a tiny model on CPU); a GPU run passes its own."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcess:
    """One `inferscale serve` child: start(), kill() (SIGKILL, as a crash), stop()."""

    def __init__(self, db_path: Path | str, log_path: Path, *, model: str = "tiny",
                 api_keys: Path | None = None, admin_key: str | None = None,
                 extra_args: Sequence[str] = (), sizing_args: Sequence[str] = CPU_SIZING
                 ) -> None:
        self.db_path, self.log_path, self.model = db_path, log_path, model
        self.api_keys, self.admin_key, self.extra_args = api_keys, admin_key, list(extra_args)
        self.sizing_args = list(sizing_args)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.attached = False

    @classmethod
    def attach(cls, base_url: str) -> ServerProcess:
        """A server started elsewhere (it cannot be started, killed or stopped from here)."""
        server = cls(Path("/nonexistent"), Path("/nonexistent"))
        server.port = int(base_url.rstrip("/").rsplit(":", 1)[1])
        server.attached = True
        return server

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT (add /v1 for OpenAI clients)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 420.0) -> ServerProcess:
        """Start the server and wait until /health answers; raise with the log tail if not."""
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> ServerProcess:
        """Start the server process without waiting for it.

        Call it from the thread that outlives the server: the child dies with the thread that
        started it (PR_SET_PDEATHSIG is per thread), so start several servers by launching each
        here, then wait_ready() on each.
        """
        assert not self.attached, "an attached server is started elsewhere"
        command = self.command()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        return self

    def wait_ready(self, timeout_s: float = 420.0) -> ServerProcess:
        """Wait until the launched server's /health answers; raise with the log tail if not."""
        assert self.process is not None, "launch() the server first"
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"inferscale serve exited ({self.process.returncode}):\n"
                                   f"{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/health", headers=headers,
                             timeout=5).status_code == 200:
                    return self
            time.sleep(0.5)
        self.kill()
        raise TimeoutError(f"inferscale serve not ready in {timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def command(self) -> list[str]:
        """The server's command line."""
        return [sys.executable, "-m", "inferscale_engine.cli", "serve", *self.model_args(),
                "--port", str(self.port), "--db", str(self.db_path), *self.sizing_args,
                "--uvicorn-log-level", "warning",
                *(["--api-keys", str(self.api_keys)] if self.api_keys else []),
                *self.extra_args]

    def model_args(self) -> list[str]:
        """The served model: 'tiny' is the tiny Qwen2 fixture (built here), in float32."""
        if self.model != "tiny":
            return [self.model]
        from tests.tiny_model import TinyModelSpec, tiny_model_path

        return [str(tiny_model_path(TinyModelSpec("qwen2"))), "--dtype", "float32"]

    def kill(self) -> None:
        """SIGKILL the whole server (API process, engine core, worker) and reap it."""
        self._signal(signal.SIGKILL, wait_s=60)

    def stop(self) -> None:
        """SIGTERM the server; SIGKILL it if it has not exited in 30 s."""
        if not self._signal(signal.SIGTERM, wait_s=30):
            self.kill()

    def log_tail(self, num_chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def _signal(self, signum: int, wait_s: float) -> bool:
        """Signal the server's process group; True once the API process has exited."""
        if self.process is None:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return False
        if signum == signal.SIGKILL or self.process.returncode is not None:
            with contextlib.suppress(ProcessLookupError):  # stragglers of the group
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        return True


@contextlib.contextmanager
def running_server(db_path: Path, log_path: Path, **options: object) -> Iterator[ServerProcess]:
    """A started ServerProcess, stopped at the end of the block."""
    server = ServerProcess(db_path, log_path, **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


class RouterProcess:
    """vllm-router (PyPI `vllm-router`) in a child process in front of replicas.

    `--policy consistent_hash`: a request goes to the replica its X-User-Id header hashes to
    (the header comes first in the router's key order); 1 s health checks, so a dead replica's
    users move within about a second.
    """

    def __init__(self, workers: Sequence[str], log_path: Path, timeout_s: float = 120.0,
                 retries: bool = True) -> None:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("vllm-router is not installed: "
                               "pip install 'inferscale-kv[replicas]'")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [binary, "--host", "127.0.0.1", "--port", str(self.port),
                   "--worker-urls", *workers, "--policy", "consistent_hash",
                   "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                   "--health-check-timeout-secs", "5", "--worker-startup-check-interval", "1",
                   "--log-level", "info",
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                   *([] if retries else ["--disable-retries"])]
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True,
                                            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm-router not ready in {timeout_s:.0f} s:\n"
                           f"{log_path.read_text()[-3000:]}")

    @staticmethod
    def binary() -> str | None:
        """The vllm-router executable (next to this Python's, or on PATH), or None."""
        local = Path(sys.executable).parent / "vllm-router"
        return str(local) if local.is_file() else shutil.which("vllm-router")

    def stop(self) -> None:
        """SIGKILL the router (it holds no state) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
