"""The package layering of DESIGN.md, checked by import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed (pip install -e '.[test]')"
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 9 kept, 0 broken" in result.stdout


def test_router_imports_nothing_heavy():
    code = "import sys, router; router.build_policy('session'); router.build_policy('budget'); print(sorted(m.split('.')[0] for m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for banned in ("fastapi", "httpx", "aiohttp", "sqlalchemy", "starlette", "pydantic", "numpy"):
        assert f"'{banned}'" not in out, banned
