from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from backends.family import FamilyMismatch, check_same_family, fingerprint
from backends.provision import DEFAULT_MODEL, provision
from gateway.config import EmbeddedSettings


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return provision(EmbeddedSettings().home, EmbeddedSettings().python, DEFAULT_MODEL)


def copy_tokenizer(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, dst / name)
    return dst


def test_identical_folders_are_one_family(model_dir, tmp_path):
    other = copy_tokenizer(model_dir, tmp_path / "other")
    check_same_family(
        {"full": fingerprint(model_dir, "hermes"), "fast": fingerprint(other, "hermes")}
    )


def test_each_difference_is_named(model_dir, tmp_path):
    other = copy_tokenizer(model_dir, tmp_path / "other")
    (other / "chat_template.jinja").write_text("{{ messages }}")
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["model"]["merges"] = tok["model"]["merges"][:-1]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(FamilyMismatch) as err:
        check_same_family(
            {"full": fingerprint(model_dir, "hermes"), "fast": fingerprint(other, "pythonic")}
        )
    message = str(err.value)
    for field in ("tokenizer differs", "chat_template differs", "tool_call_parser differs"):
        assert field in message
