"""Lint and strict typing are part of the suite, so `main` cannot drift from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff():
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict():
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
