"""Every benchmark record names the code it measured: a commit, and whether the sources differ.

The GPU machine runs a copy of the working tree whose .git can be older than its files; its
records named that older commit as if it had been measured.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.common import git_state


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_a_tree_newer_than_its_commit_is_flagged(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("git is not installed")
    (tmp_path / "benchmarks").mkdir()
    source = tmp_path / "benchmarks" / "bench.py"
    source.write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "one")
    commit, modified = git_state(tmp_path)
    assert commit and modified is False
    source.write_text("x = 2\n")  # measured code that is not the commit's
    assert git_state(tmp_path) == (commit, True)
    assert git_state(tmp_path / "benchmarks" / "..") == (commit, True)


def test_outside_a_checkout_nothing_is_claimed(tmp_path):
    assert git_state(tmp_path) == (None, None)
