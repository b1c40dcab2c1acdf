"""The trained classifier: training, prediction, the shipped model, bad model files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.classifier import (
    DEFAULT_MODEL,
    DEFAULT_SAMPLED_MODEL,
    DENSE,
    Classifier,
    bucket,
    dense_features,
    ngrams,
)
from router.dataset import ExamplesError, read_examples, write_examples
from router.evaluation import auc
from router.training import fit, split
from router.types import SessionState
from tests.router.conftest import synthetic

HARD = {"messages": [{"role": "user", "content": "Compute 48213 * 99121 and then add 417."}]}
EASY = {"messages": [{"role": "user", "content": "tell me about the river please"}]}


def test_learns_a_separable_signal_and_generalizes(model_file: Path):
    model = Classifier.load(model_file)
    held_out = synthetic(80, seed=1)
    scores = [model.predict(e.body).probability for e in held_out]
    assert auc(scores, [e.label() for e in held_out]) > 0.85
    assert model.predict(HARD).probability > model.threshold > model.predict(EASY).probability


def test_training_is_deterministic():
    a = fit(synthetic(60), l2_grid=(0.1, 0.01), folds=3)
    b = fit(synthetic(60), l2_grid=(0.1, 0.01), folds=3)
    assert a == b


def test_prediction_is_deterministic_and_explained(model_file: Path):
    model = Classifier.load(model_file)
    first, second = model.predict(HARD), model.predict(HARD)
    assert first == second
    assert len(first.top) == 3 and all(isinstance(v, float) for _, v in first.top)
    assert set(DENSE) <= set(first.features) and "prompt_tokens" in first.features


def test_session_history_is_a_feature(model_file: Path):
    model = Classifier.load(model_file)
    plain = model.predict(EASY).features
    failed = model.predict(EASY, SessionState(steps=3, fast_failures=2, escalations=1)).features
    assert plain["session_fast_failures"] == 0 and failed["session_fast_failures"] == 2


def test_numbers_become_shapes():
    grams = ngrams({"messages": [{"role": "user", "content": "Add 12 and 345678, (now)!"}]})
    assert "00" in grams and "000000" in grams and "add 00" in grams and "now" in grams
    assert not any(set(g) & set("123456789,()!") for g in grams)


def test_only_the_ends_of_a_huge_message_are_read(model_file: Path):
    """What keeps a decision cheap whatever the input (timings: bench.router_latency)."""
    model = Classifier.load(model_file)
    head, tail = "Compute 48213 * 99121. " * 200, " then add 417." * 200  # 4.6 KB, 2.8 KB

    def body(middle: str) -> dict:
        return {"messages": [{"role": "user", "content": head + middle + tail}]}

    small, huge = body("the weather is nice " * 10), body("7 * 7 = 49; " * 40_000)  # +480 KB
    assert ngrams(small) == ngrams(huge)
    (x_small, _), (x_huge, _) = dense_features(small), dense_features(huge)
    assert x_huge["log_prompt_tokens"] > x_small["log_prompt_tokens"]  # length itself counts
    del x_small["log_prompt_tokens"], x_huge["log_prompt_tokens"]
    assert x_small == x_huge  # but no feature reads the middle of the text
    assert len(model.predict(huge).top) == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"format": "other"}', "not a Gearshift router model"),
        ('{"format": "gearshift-router-logreg/1", "bias": 0}', "incomplete or malformed"),
    ],
)
def test_bad_model_files_are_named(tmp_path: Path, content: str, message: str):
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        Classifier.load(path)
    with pytest.raises(ValueError, match="does not exist"):
        Classifier.load(tmp_path / "missing.json")


@pytest.mark.parametrize("path", [DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL], ids=["greedy", "sampled"])
def test_the_shipped_models_load_and_route(path: Path):
    model = Classifier.load(path)
    spec = json.loads(path.read_text())
    assert spec["training"]["examples"] > 100
    assert 0.0 < model.threshold < 1.0
    code = {"messages": [{"role": "user", "content": "Complete this Python function.\n```python\ndef f(x):\n```"}]}  # fmt: skip
    assert model.predict(code).probability > model.predict(EASY).probability


def test_split_is_stratified_and_deterministic():
    examples = synthetic(100)
    train, test = split(examples, 0.3, seed=4)
    assert len(test) == 30 and {e.group for e in test} == {"hard", "easy"}
    assert [e.id for e in split(examples, 0.3, seed=4)[1]] == [e.id for e in test]
    assert not {e.id for e in train} & {e.id for e in test}


def test_too_few_positives_is_a_clear_error():
    examples = [e for e in synthetic(40) if not e.label()][:20]
    with pytest.raises(ValueError, match="too few examples"):
        fit(examples)


def test_examples_round_trip_and_errors(tmp_path: Path):
    path = tmp_path / "ex.jsonl"
    write_examples(path, synthetic(4))
    assert [e.id for e in read_examples(path)] == ["ex0", "ex1", "ex2", "ex3"]
    path.write_text('{"body": {}, "full": 1, "fast": 2}\n')
    with pytest.raises(ExamplesError, match=r"ex.jsonl:1: 'fast' must be a score"):
        read_examples(path)
    path.write_text("\n[1]\n")
    with pytest.raises(ExamplesError, match=r":2: want an object"):
        read_examples(path)


def test_the_kept_text_terms_explain_as_a_whole_computation_would():
    """The last user message's terms are kept by its text; the explanation's top three
    are still the top three over every contribution."""
    model = Classifier.load(DEFAULT_MODEL)
    body = {"messages": [{"role": "user", "content": "Compute 48213 * 99121, then fix def f(x):"}]}
    first, again = model.predict(body), model.predict(json.loads(json.dumps(body)))
    assert first == again
    probability, top, _ = _reference(model, body, None)
    assert (first.probability, first.top) == (probability, top)


def _reference(model: Classifier, body: dict, session: SessionState | None) -> tuple:
    """What ``predict`` computes, written out the plain way: the dense inputs standardized
    one by one, every text term, the top three by size over all of them."""
    import math

    from router.classifier import standardize

    x, raw = dense_features(body, session)
    terms = [(n, model.dense[n] * standardize(x[n], model.mean[n], model.scale[n])) for n in DENSE]
    grams = ngrams(body)
    for gram in grams:
        w = model.hashed.get(bucket(gram, model.bits))
        if w:
            terms.append(("text:" + gram, w / math.sqrt(len(grams))))
    top = sorted(terms, key=lambda kv: (-abs(kv[1]), kv[0]))[:3]
    z = math.fsum([model.bias, *(v for _, v in terms)])
    p = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
    return p, tuple((k, round(v, 3)) for k, v in top), {**raw, **x}


@pytest.mark.parametrize("path", [DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL], ids=["greedy", "sampled"])
def test_predictions_are_the_plain_computation_exactly(path: Path):
    """Agent session steps, the synthetic set, with and without a session's failures: the
    same probability, explanation and features, float for float."""
    from bench.agent_body import session_bodies

    model = Classifier.load(path)
    bodies = [*session_bodies(seed=3), *(e.body for e in synthetic(40, seed=2))]
    for i, body in enumerate(bodies):
        session = SessionState(steps=i, fast_failures=i % 4, escalations=i % 3) if i % 2 else None
        got = model.predict(body, session)
        assert (got.probability, got.top, got.features) == _reference(model, body, session)
