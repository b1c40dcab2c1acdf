"""The air-gapped install: `gearshift bundle` writes the gateway's wheels into a tar file,
and `scripts/install.sh --from` installs them in a fresh directory from a process with no
network at all (its own network namespace) and no package index. The engine and models
part of a bundle (3 GB) is not built here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT, VERSION

pytestmark = pytest.mark.slow


def no_network_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: cannot block the network")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (root needed): {probe.stderr.strip()}")
    return [unshare, "-n"]


def test_bundle_installs_with_no_network_and_no_index(tmp_path: Path) -> None:
    offline = no_network_prefix()
    bundle = tmp_path / "gearshift-bundle.tar"
    made = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "bundle", str(bundle), "--gateway-only"],
        capture_output=True, text=True, timeout=900, check=False, cwd=ROOT,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    progress = [line for line in made.stdout.splitlines() if line.startswith("==> ")]
    assert progress[0] == "==> [1/2] gateway wheels (gearshift and its dependencies)"
    assert progress[1] == f"==> [2/2] writing {bundle}"
    assert progress[-1].startswith(f"==> {bundle}: ") and "(gateway)" in progress[-1]
    assert made.stdout.count("    done in ") == 2
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("gearshift-bundle.*/"))
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = tar.extractfile("./MANIFEST")
        assert manifest is not None
        assert f"gearshift {VERSION}" in manifest.read().decode()
    assert any(n.startswith(f"./wheels/gateway/gearshift-{VERSION}-") for n in names)

    fresh = tmp_path / "fresh"  # the offline machine: the scripts and the bundle, nothing else
    (fresh / "scripts").mkdir(parents=True)
    for script in ("install.sh", "install-bundle.sh"):
        shutil.copy2(ROOT / "scripts" / script, fresh / "scripts" / script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["GEARSHIFT_HOME"] = str(tmp_path / "home")
    installed = subprocess.run(
        [*offline, str(fresh / "scripts" / "install.sh"), "--from", str(bundle)],
        capture_output=True, text=True, timeout=900, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert "Looking in indexes" not in installed.stdout + installed.stderr

    gearshift = fresh / ".venv" / "bin" / "gearshift"
    key = subprocess.run(
        [*offline, str(gearshift), "keys", "new", "--tenant", "t1"],
        capture_output=True, text=True, timeout=120, check=True, env=env,
    )  # fmt: skip
    assert "sha256" in key.stdout
    where = subprocess.run(
        [str(fresh / ".venv" / "bin" / "python"), "-c", "import gateway; print(gateway.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert where.stdout.startswith(str(fresh / ".venv"))  # the bundle's wheel, not this checkout


def test_bundle_pins_the_engine_install_sh_installs() -> None:
    from gateway.cli.bundle import ENGINE_REQS

    install = (ROOT / "scripts" / "install.sh").read_text()
    (line,) = [ln for ln in install.splitlines() if ln.startswith("VLLM_REQS=")]
    assert tuple(line.split("=", 1)[1].strip('"').split()) == ENGINE_REQS


def test_bundle_refuses_what_it_cannot_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.cli.bundle as bundle

    def no_pip(dest: Path, *reqs: str, deps: bool = True) -> None:  # only the models step fails
        dest.mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(bundle, "_pip_wheel", no_pip)
    lines: list[str] = []
    with pytest.raises(bundle.BundleError, match=r"no converted model in .*gearshift provision"):
        bundle.write_bundle(tmp_path / "b.tar", tmp_path / "no-models", engine=True,
                            images=False, say=lines.append)  # fmt: skip
    assert lines[0] == "==> [1/4] gateway wheels (gearshift and its dependencies)"
    assert lines[2].startswith("==> [2/4] engine wheels: torch==")
    assert not list(tmp_path.iterdir())  # no bundle, no partial file, no work folder left
