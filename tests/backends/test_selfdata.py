"""The filters and the prompt of self-written healing data (the generation itself runs on the
real default model in test_pruning.py)."""

import pytest

from backends.selfdata import SelfDataError, keep, user_turn_prefix


class Template:
    def __init__(self, render):
        self.render = render

    def apply_chat_template(self, messages, tokenize):
        assert tokenize is False
        return self.render(messages)


def test_the_prompt_stops_where_the_users_words_begin():
    chatml = Template(lambda m: f"<|system|>be kind<|user|>{m[0]['content']}<|end|>")
    assert user_turn_prefix(chatml) == "<|system|>be kind<|user|>"
    ignores_content = Template(lambda m: "<|user|>hello<|end|>")
    with pytest.raises(SelfDataError, match="does not render the user's message"):
        user_turn_prefix(ignores_content)


def test_only_finished_new_and_long_enough_texts_are_kept():
    seen = {"asked before, in an earlier round"}
    texts = [
        ("  How do tides work?  ", "stop"),
        ("How do tides work?", "stop"),  # a duplicate of the first, once stripped
        ("Write me a poem about the sea and the sea and the sea and", "length"),  # ran out
        ("Hi", "stop"),  # too short to be a request
        ("asked before, in an earlier round", "stop"),
        ("What is a prime number?", "stop"),
    ]
    assert keep(texts, seen) == ["How do tides work?", "What is a prime number?"]
    assert "What is a prime number?" in seen
