"""`gearshift prune` on tiny random models of each family, in the engine environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.provision import DEFAULT_MODEL, provision
from backends.pruning import DEFAULT_CALIBRATION
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

RENDER = """
import json, sys
from pathlib import Path
from transformers import AutoTokenizer
from backends.pruning import load_texts
print(json.dumps(load_texts(Path(sys.argv[2]), AutoTokenizer.from_pretrained(sys.argv[1]))[-1]))
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


def test_healing_on_a_file_of_conversations_keeps_it_with_the_weights(tiny, tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is {i} + {i}?"},
        {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]}) + "\n" for i in range(5)))  # fmt: skip
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    with data.open(
        "a"
    ) as f:  # a `gearshift export --format trl-sft` row: tools, a call, its result
        f.write(json.dumps({"tools": [weather], "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "content": "-3 C, snow"},
            {"role": "assistant", "content": "It is -3 C and snowing in Oslo."}]}) + "\n")  # fmt: skip
    out = tmp_path / "healed"
    result = prune(
        tiny / "llama", out, "--remove", "2", "--heal-steps", "2", "--heal-data", str(data)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    healing = json.loads((out / "gearshift-prune.json").read_text())["healing"]
    calibration = sum(1 for line in DEFAULT_CALIBRATION.read_text().splitlines() if line.strip())
    held_out = max(2, calibration // 5)
    assert healing["data"] == str(data)
    assert healing["samples"] == calibration - held_out + 6  # the training split joins the file
    assert (out / "gearshift-heal-data.jsonl").read_bytes() == data.read_bytes()
    rendered = subprocess.run([str(ENGINE), "-c", RENDER, str(tiny / "llama"), str(data)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    last = json.loads(rendered.stdout.strip().splitlines()[-1])
    for part in ('"name": "get_weather"', '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                 "<tool_response>\n-3 C, snow", "snowing in Oslo"):  # fmt: skip
        assert part in last, part
    again = tmp_path / "again"  # pruning the pruned model does not carry the old healing data along
    assert prune(out, again, "--remove", "1").returncode == 0
    assert not (again / "gearshift-heal-data.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--remove", "2"), "GPT2LMHeadModel is not supported"),
        (("--remove", "6"), "cannot remove 6 of 6 layers"),
        (("--remove", "2", "--heal-data", "self"), "--heal-data self needs --heal-steps"),
        (("--remove", "2", "--heal-steps", "1", "--heal-data", "nope.jsonl"),
         "--heal-data nope.jsonl: no such file; give 'calibration', 'self' or a JSONL file"),
        (("--remove", "2", "--heal-steps", "1", "--heal-data", "self", "--heal-samples", "2"),
         "--heal-samples must be at least 4"),
        (("--remove", "2", "--heal-steps", "1", "--self-data", "kept.jsonl"),
         "--self-data keeps what --heal-data self writes; add --heal-data self"),
        (("--remove", "2", "--heal-steps", "1", "--heal-data", str(ROOT / "pyproject.toml")),
         "pyproject.toml:1: not JSON"),
    ],
)  # fmt: skip
def test_clear_errors(tiny, tmp_path, args, message):
    src = tiny / ("gpt2" if "GPT2" in message else "llama")
    result = prune(src, tmp_path / "x", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "x").exists()


def test_the_full_model_writes_its_own_healing_conversations(tmp_path):
    """--heal-data self on the real default model: vLLM writes the requests and the answers."""
    source = provision(EmbeddedSettings().home, ENGINE, DEFAULT_MODEL)
    out, shared = tmp_path / "self-healed", tmp_path / "shared" / "self.jsonl"
    result = prune(source, out, "--remove", "2", "--heal-steps", "2", "--heal-data", "self",
                   "--heal-samples", "4", "--self-data", str(shared))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    healing = json.loads((out / "gearshift-prune.json").read_text())["healing"]
    assert healing["data"] == "self" and healing["self_data"]["answers_kept"] == 4
    assert "reused" not in healing["self_data"]
    assert shared.read_bytes() == (out / "gearshift-heal-data.jsonl").read_bytes()

    # Another pruning of the same model heals on the same conversations without writing them.
    again = tmp_path / "again"
    result = prune(source, again, "--remove", "3", "--heal-steps", "1", "--heal-data", "self",
                   "--heal-samples", "4", "--self-data", str(shared))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reused = json.loads((again / "gearshift-prune.json").read_text())["healing"]["self_data"]
    assert reused["reused"] == str(shared)
    assert reused["requests_written"] == healing["self_data"]["requests_written"]
    assert (again / "gearshift-heal-data.jsonl").read_bytes() == shared.read_bytes()
    assert healing["self_data"]["requests_written"] >= healing["self_data"]["requests_kept"] >= 4
    written = [
        json.loads(line) for line in (out / "gearshift-heal-data.jsonl").read_text().splitlines()
    ]
    assert len(written) == 4
    for conversation in written:
        roles = [m["role"] for m in conversation["messages"]]
        assert roles == ["user", "assistant"]
        assert all(
            m["content"].strip() == m["content"] and m["content"] for m in conversation["messages"]
        )
    assert len({c["messages"][0]["content"] for c in written}) == 4  # no request twice


def test_the_default_model_heals_on_the_conversations_the_repository_ships(tmp_path, monkeypatch):
    """Every machine builds the embedded fast tier from the same 256 conversations instead of
    writing its own (which differ from machine to machine, and the tier with them)."""
    from backends import provision as provisioning

    source = provision(EmbeddedSettings().home, ENGINE, DEFAULT_MODEL)
    shipped = provisioning.shipped_self_data(source, 256)
    assert shipped is not None, "no shipped conversations match the default model's folder name"
    assert provisioning.shipped_self_data(source, 64) is None  # other counts are written
    conversations = [json.loads(line) for line in shipped.read_text().splitlines()]
    assert len(conversations) == 256
    assert all([m["role"] for m in c["messages"]] == ["user", "assistant"] for c in conversations)
    before = shipped.read_bytes()

    # Pruning reads them as written data of this model, without starting vLLM to write any.
    out = tmp_path / "healed"
    result = prune(source, out, "--remove", "2", "--heal-steps", "1", "--heal-data", "self",
                   "--heal-samples", "256", "--self-data", str(shipped))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    healing = json.loads((out / "gearshift-prune.json").read_text())["healing"]
    assert healing["self_data"]["reused"] == str(shipped)
    assert (out / "gearshift-heal-data.jsonl").read_bytes() == before == shipped.read_bytes()

    # Provisioning passes them, and they (not the writing code) key the cached build.
    calls: list[list[str]] = []

    def run_pruning(_: Path, args: list[str]) -> int:  # what it would run; built above
        calls.append(args)
        Path(args[1]).mkdir(parents=True)
        return 0

    monkeypatch.setattr(provisioning, "run_pruning", run_pruning)
    options = provisioning.PruneOptions(4, heal_steps=400, heal_data="self", heal_samples=256)
    built = provisioning.provision_pruned(tmp_path, ENGINE, source, options)
    assert calls[-1][-2:] == ["--self-data", str(shipped)]
    other = provisioning.PruneOptions(4, heal_steps=400, heal_data="self", heal_samples=64)
    elsewhere = provisioning.provision_pruned(tmp_path, ENGINE, source, other)
    assert calls[-1][-1].startswith(str(tmp_path / "heal-data"))
    assert built != elsewhere
