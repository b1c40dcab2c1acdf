"""A small trained model for policy tests: fitted on synthetic examples whose label is
'the user asks for arithmetic with long numbers' (deterministic, a second to train)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from router.training import Example, fit

WORDS = ["please", "tell", "me", "about", "the", "weather", "story", "poem", "city", "river"]


def synthetic(n: int = 160, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        hard = i % 2 == 0
        if hard:
            a, b = rng.randrange(1000, 99999), rng.randrange(1000, 99999)
            text = f"Compute {a} * {b} and then add {rng.randrange(100, 999)}."
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 9)))
        body = {"messages": [{"role": "user", "content": text}]}
        noise = rng.random() < 0.05
        full, fast = (1.0, 0.0) if hard != noise else (1.0, 1.0)
        out.append(Example(f"ex{i}", body, full, fast, "hard" if hard else "easy"))
    return out


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = fit(synthetic(), l2_grid=(0.01,), folds=3)
    path = tmp_path_factory.mktemp("router") / "model.json"
    path.write_text(json.dumps(spec))
    return path
