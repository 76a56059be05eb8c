"""The example notebooks execute top to bottom (nbclient) on the tiny model.

They are committed with the outputs of a real run on the 0.5B model (what a reader sees on
GitHub); the test clears those outputs and runs each notebook again on the tiny model.

The kernel is this interpreter: a kernelspec pointing at sys.executable is written to a
temporary folder that JUPYTER_PATH puts first, so a clean CI machine (no registered kernels)
and a laptop with other 'python3' kernels run the notebooks with the same venv. Each notebook
starts its own engine in the kernel process (the test process keeps its own).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "examples" / "notebooks"
KERNEL = "inferscale-test-venv"

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory, tiny_models):
    """A kernelspec for this interpreter, first on JUPYTER_PATH (tiny model built by then)."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "InferScale tests", "language": "python",
        "env": {"INFERSCALE_MODEL": str(tiny_models["qwen2"]), "VLLM_LOGGING_LEVEL": "WARNING",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline"}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(root))
        yield KERNEL


def execute(name: str, kernel_name: str):
    import nbclient
    import nbformat

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    committed = _text(notebook)
    assert "qwen2.5-coder-0.5b-instruct" in committed, (
        f"{name} is committed without the outputs of a run on the 0.5B model")
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    start = time.perf_counter()
    nbclient.NotebookClient(notebook, kernel_name=kernel_name, timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
    return notebook


def _text(notebook) -> str:
    return "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")


def test_quickstart_runs(kernel_name):
    text = _text(execute("quickstart.ipynb", kernel_name))
    assert "8 facts stored and encoded" in text
    assert "'injected': 1" in text  # ConversationChain's answer came from injected KV
    assert "user: 'And what am I allergic to?'" in text  # LlamaIndex continued the chat


def test_ttft_vs_k_runs_and_plots(kernel_name):
    notebook = execute("ttft_vs_k.ipynb", kernel_name)
    text = _text(notebook)
    print(text)
    rows = [line.split() for line in text.splitlines() if line.split()[1:2] == ["kv"]]
    assert [int(r[0]) for r in rows] == [0, 4, 16, 32]
    assert all(int(r[4]) > 0 for r in rows if int(r[0]) > 0)  # k > 0: facts injected
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) == 1


def test_langgraph_store_runs(kernel_name):
    text = _text(execute("langgraph_store.ipynb", kernel_name))
    assert "[('memories', 'caroline')]" in text
    assert "'injected': 2" in text  # both agent answers came from injected KV


def test_llamaindex_memory_blocks_runs(kernel_name):
    text = _text(execute("llamaindex_memory_blocks.ipynb", kernel_name))
    assert "8 facts stored and encoded" in text and "'injected': 2" in text
    assert "tools called:" in text


def test_serve_and_clients_runs(kernel_name):
    text = _text(execute("serve_and_clients.ipynb", kernel_name))
    assert "8 facts stored and encoded" in text and "server exit code 0" in text
    assert "What is my dog's name? -> " in text and "Where do I live? -> " in text
    # mem0's own client (its own venv): an agent-scoped add, search, update and history
    assert "(agent coach)" in text
    assert ("UPDATE 'I am training for a half marathon in May.' -> 'I am training for a full "
            "marathon in October.'") in text
