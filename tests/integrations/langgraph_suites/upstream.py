"""Other projects' test modules, fetched from their published sdists at test time.

    folder = fetch_tests("langgraph-checkpoint-sqlite")   # .cache/upstream-tests/<name>-<version>
    module = import_test_module(folder, "test_store")

The version is the one installed here (importlib.metadata), so the tests match the code they
test. `pip download --no-deps --no-binary :all:` fetches the sdist once; its tests/ folder is
unpacked under .cache/upstream-tests/ (git ignores .cache/), never into the repository.

Their modules import their helpers as `tests.<module>` (their tests/ folder is a package named
`tests`, like ours): import_test_module resolves those names to their folder while it imports,
then puts ours back.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[3]
CACHE = REPO_ROOT / ".cache" / "upstream-tests"
"""Where fetched test folders are kept (git ignores .cache/)."""


class FetchError(RuntimeError):
    """An sdist could not be downloaded or holds no tests/ folder."""


def fetch_tests(distribution: str) -> Path:
    """The tests/ folder of the installed version's sdist (downloaded on first use).

    Raises:
        FetchError: the distribution is not installed, pip cannot download its sdist (no
            network, no sdist published), or the sdist has no tests/ folder.
    """
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FetchError(f"{distribution} is not installed; pip install "
                         "'inferscale-kv[dev]'") from exc
    folder = CACHE / f"{distribution}-{version}"
    if (folder / "tests").is_dir():
        return folder / "tests"
    with tempfile.TemporaryDirectory(prefix="sdist-") as download:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", "-q", "-d", download, f"{distribution}=={version}"],
            capture_output=True, text=True, timeout=300, check=False)
        archives = sorted(Path(download).glob("*.tar.gz"))
        if done.returncode != 0 or len(archives) != 1:
            raise FetchError(f"pip could not download the sdist of {distribution}=={version} "
                             f"({done.returncode}): {done.stderr.strip()[-800:]}")
        _unpack_tests(archives[0], folder)
    if not (folder / "tests").is_dir():
        raise FetchError(f"the sdist of {distribution}=={version} has no tests/ folder")
    return folder / "tests"


def _unpack_tests(archive: Path, folder: Path) -> None:
    """Unpack the sdist's <top>/tests/ files into folder/tests (atomically: a temp, a rename)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    with tarfile.open(archive) as sdist:
        members = [m for m in sdist.getmembers()
                   if m.isfile() and len(Path(m.name).parts) >= 3
                   and Path(m.name).parts[1] == "tests"]
        for member in members:
            member.name = str(Path(*Path(member.name).parts[1:]))
        sdist.extractall(staging, members=members, filter="data")
    try:
        staging.rename(folder)
    except OSError:  # another run unpacked it meanwhile
        shutil.rmtree(staging, ignore_errors=True)


def import_test_module(tests: Path, name: str, package: str) -> ModuleType:
    """Import tests/<name>.py as `<package>.<name>`, its `tests.*` imports from `tests`."""
    with _their_tests_package(tests, package):
        return importlib.import_module(f"tests.{name}")


@contextmanager
def _their_tests_package(tests: Path, package: str) -> Iterator[None]:
    """While open, `tests.<x>` for each <x>.py of their folder is theirs (renamed package.x)."""
    names = {f"tests.{p.stem}" for p in tests.glob("*.py") if p.stem != "__init__"}
    ours = {name: sys.modules.pop(name) for name in list(sys.modules) if name in names}
    tests_package = sys.modules["tests"]
    attributes = {name: getattr(tests_package, name.split(".")[1], None) for name in names}
    finder = _Finder(tests, package, names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(ours)
        for name, value in attributes.items():
            attribute = name.split(".")[1]
            if value is None:
                tests_package.__dict__.pop(attribute, None)
            else:
                setattr(tests_package, attribute, value)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `tests.<x>` in their folder; the module is also registered as `<package>.<x>`."""

    def __init__(self, tests: Path, package: str, names: set[str]) -> None:
        self._tests, self._package, self._names = tests, package, names

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        stem = fullname.split(".")[1]
        return importlib.util.spec_from_file_location(
            fullname, self._tests / f"{stem}.py", loader=_Loader(f"{self._package}.{stem}"))


class _Loader(importlib.abc.Loader):
    def __init__(self, alias: str) -> None:
        self._alias = alias

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        assert module.__spec__ is not None and module.__spec__.origin is not None
        source = Path(module.__spec__.origin).read_text(encoding="utf-8")
        module.__name__ = self._alias  # their functions' __module__, found in sys.modules
        sys.modules[self._alias] = module
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)
