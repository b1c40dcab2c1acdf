"""`gearshift router train|eval`: a model trained from a JSONL file, scored against baselines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.cli.main import main
from router.classifier import Classifier
from router.dataset import write_examples
from tests.router.conftest import synthetic


def test_train_then_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_examples(train, synthetic(120, seed=0))
    write_examples(test, synthetic(60, seed=1))
    model = tmp_path / "out" / "router.json"
    assert main(["router", "train", str(train), "--out", str(model)]) == 0
    said = capsys.readouterr().out
    assert re.search(r"trained on 120 examples \(\d+ need the full tier\)", said)
    assert str(model) in said
    assert Classifier.load(model).threshold > 0
    assert main(["router", "eval", str(test), "--model", str(model)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["router", "AUC", "APGR", "CPT50", "CPT80"]
    figures = json.loads(out[-1])
    assert figures["auc"] > 0.85 and figures["apgr"] > figures["apgr_best_baseline"]
    assert set(figures["report"]) >= {"classifier", "always_full", "random", "length_threshold"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"body": {}, "full": 1}\n', "'fast' must be a score"),
        ("", "no examples"),
        ("not json\n", "not JSON"),
    ],
)
def test_bad_examples_are_named(tmp_path: Path, content: str, message: str):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SystemExit, match=message):
        main(["router", "train", str(path), "--out", str(tmp_path / "m.json")])
    assert not (tmp_path / "m.json").exists()


def test_eval_without_a_model_says_how_to_get_one(tmp_path: Path):
    path = tmp_path / "ex.jsonl"
    write_examples(path, synthetic(20))
    with pytest.raises(SystemExit, match="gearshift router train"):
        main(["router", "eval", str(path), "--model", str(tmp_path / "none.json")])
