"""`gearshift prune` on tiny random models of each family, in the engine environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.provision import DEFAULT_MODEL, provision
from gateway.config import EmbeddedSettings

ROOT = Path(__file__).parents[2]
ENGINE = EmbeddedSettings().python
GEARSHIFT = Path(sys.executable).with_name("gearshift")

CHECK = """
import json, sys
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
import torch
out = sys.argv[1]
config = AutoConfig.from_pretrained(out)
with safe_open(out + "/model.safetensors", "pt") as f:
    layers = sorted({int(k.split(".")[2]) for k in f.keys() if k.startswith("model.layers.")})
model = AutoModelForCausalLM.from_pretrained(out)
tok = AutoTokenizer.from_pretrained(out)
ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt")
ids = ids["input_ids"] if hasattr(ids, "keys") else ids
logits = model(input_ids=ids).logits
print(json.dumps({"num_hidden_layers": config.num_hidden_layers, "layers": layers,
                  "logits": list(logits.shape), "vocab": model.config.vocab_size}))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    source = provision(EmbeddedSettings().home, ENGINE, DEFAULT_MODEL)
    subprocess.run([str(ENGINE), str(Path(__file__).with_name("tiny_models.py")), str(source), str(out)],
                   check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    return out


def prune(src: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GEARSHIFT), "prune", str(src), str(out), "--quiet", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def check(out: Path) -> dict[str, object]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(ENGINE), "-c", CHECK, str(out)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_block_influence_keeps_a_loadable_renumbered_checkpoint(tiny, tmp_path, family):
    out = tmp_path / "pruned"
    result = prune(tiny / family, out, "--remove", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "gearshift-prune.json").read_text())
    assert (
        report["layers_before"] == 6 and report["layers_after"] == 4 and len(report["removed"]) == 2
    )
    assert len(report["scores"]) == 6
    loaded = check(out)
    assert loaded == {
        "num_hidden_layers": 4,
        "layers": [0, 1, 2, 3],
        "logits": loaded["logits"],
        "vocab": 49152,
    }
    assert loaded["logits"][-1] == 49152
    for name in ("tokenizer.json", "chat_template.jinja"):  # the family's files travel unchanged
        assert (out / name).read_bytes() == (tiny / family / name).read_bytes()


def test_scores_are_deterministic_and_angular_removes_a_block(tiny, tmp_path):
    runs = []
    for i in range(2):
        out = tmp_path / f"a{i}"
        assert (
            prune(tiny / "llama", out, "--keep-ratio", "0.5", "--method", "angular").returncode == 0
        )
        runs.append(json.loads((out / "gearshift-prune.json").read_text()))
    assert runs[0]["scores"] == runs[1]["scores"] and runs[0]["removed"] == runs[1]["removed"]
    removed = runs[0]["removed"]
    assert len(removed) == 3 and removed == list(range(removed[0], removed[0] + 3))  # contiguous


def test_healing_reports_quality_before_and_after(tiny, tmp_path):
    out = tmp_path / "healed"
    result = prune(tiny / "llama", out, "--remove", "2", "--heal-steps", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "gearshift-prune.json").read_text())
    assert set(report["perplexity"]) == {"full", "pruned", "healed"}
    assert report["healing"]["steps"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--remove", "2"), "GPT2LMHeadModel is not supported"),
        (("--remove", "6"), None),
    ],
)
def test_clear_errors(tiny, tmp_path, args, message):
    src = tiny / ("gpt2" if message else "llama")
    result = prune(src, tmp_path / "x", *args)
    assert result.returncode == 2
    assert (message or "cannot remove 6 of 6 layers") in result.stderr
    assert not (tmp_path / "x").exists()
