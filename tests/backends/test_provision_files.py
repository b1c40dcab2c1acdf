"""Provisioned checkpoints are readable by a tier that runs as another user."""

from __future__ import annotations

from pathlib import Path

from backends.provision import readable


def test_checkpoint_files_become_world_readable(tmp_path: Path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"w")
    weights.chmod(0o600)  # as the weights writer leaves them
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.json").write_text("{}")
    readable(tmp_path)
    assert weights.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "sub" / "config.json").stat().st_mode & 0o044 == 0o044
