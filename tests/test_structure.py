"""The shape of the tree: small modules, imports that flow one way, light bookkeeping modules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("inferscale_engine", "inferscale_integrations")
MAX_LINES = 450

MAX_TOP_MODULES = 10
LAYERS = [
    # 0: plain data, checks and math, the plan protocol, prompts, model support, kernels
    {"errors", "facts", "checks", "config", "protocol", "prompting", "model", "kernels"},
    # 1: what vLLM loads in its own processes
    {"connector"},
    # 2: the runtime around a co-located vLLM
    {"runtime"},
    # 3: the memory layer (users, durable facts, retrieval, serving)
    {"memory"},
    # 4: what apps touch: the command line and the framework adapters
    {"cli", "data_commands", "__init__", "server", "inferscale_integrations"},
]


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def layer_of(module: str) -> int:
    """Layer of a dotted module name of ours."""
    parts = module.split(".")
    if parts[0] == "inferscale_integrations":
        return 4
    name = parts[1] if len(parts) > 1 else "__init__"
    for level, names in enumerate(LAYERS):
        if name in names:
            return level
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def is_module(name: str) -> bool:
    base = ROOT / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """Every module of ours that `path` imports (top level, in functions, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if is_module(f"{node.module}.{a.name}")
                     else node.module for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in PACKAGES)
    return found


def packages() -> list[Path]:
    return sorted(p.parent for package in PACKAGES for p in (ROOT / package).rglob("__init__.py"))


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_package_map_names_every_module_in_it(package):
    """A package's __init__ docstring is its map: every module (name.py) and subpackage (name/)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = [f"{p.stem}.py" for p in package.glob("*.py") if p.stem != "__init__"]
    names += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = sorted(n for n in names if not re.search(rf"(?<![\w/]){re.escape(n)}(?!\w)", doc))
    assert not missing, f"name {missing} in the map of {package.relative_to(ROOT)}/__init__.py"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_the_limit(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, "split it by concept"


def test_the_engine_has_few_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "inferscale_engine").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"group them into packages: {top}"


def test_imports_flow_from_higher_layers_to_lower_ones():
    offences = []
    for path in modules():
        here = dotted(path)
        for module in imports_of(path):
            if layer_of(module) > layer_of(here):
                offences.append(f"{here} (layer {layer_of(here)}) imports {module} "
                                f"(layer {layer_of(module)})")
    assert not offences, "\n".join(offences)


def test_bookkeeping_modules_import_neither_torch_nor_vllm():
    code = ("import sys; import inferscale_engine.runtime.residency, inferscale_engine.checks, "
            "inferscale_engine.protocol.plan, inferscale_engine.runtime.generation, "
            "inferscale_engine.memory.store, inferscale_engine.memory.types, "
            "inferscale_engine.memory.store.records, inferscale_engine.memory.config, "
            "inferscale_engine.memory.store.reserved, inferscale_engine.memory.search.filters; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_the_memory_entry_point_still_imports():
    code = ("from inferscale_engine.memory import Memory, MemoryConfig; "
            "from inferscale_engine import Memory as M2; assert Memory is M2; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "ok"
