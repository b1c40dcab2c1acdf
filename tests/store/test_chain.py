"""The hash chain computed step by step (``ChainCache``) equals the definition
(``history_hash`` of the whole history), whatever the history holds, and whatever the cache
has kept or forgotten."""

from __future__ import annotations

import json
import random
from typing import Any

from gateway.store.chain import ChainCache, History, history_hash


def answer(rng: random.Random, step: int, sample: int) -> dict[str, Any]:
    """An upstream answer: text, or tool calls (arguments as vLLM writes them)."""
    if rng.random() < 0.3:
        return {"role": "assistant", "content": f"step {step} sample {sample} " * rng.randint(1, 4)}
    calls = [
        {
            "id": f"call_{step}_{sample}_{i}",
            "type": "function",
            "function": {
                "name": rng.choice(["read", "grep"]),
                "arguments": json.dumps({"path": f"f{rng.randint(0, 3)}", "n": i}),
            },
        }
        for i in range(rng.randint(1, 3))
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls, "refusal": None}


def resent(message: dict[str, Any]) -> dict[str, Any]:
    """The answer as an SDK sends it back: keys reordered, arguments re-dumped, ``refusal``
    dropped, content as parts. Canonically the same message."""
    out: dict[str, Any] = {}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "function": {"arguments": json.dumps(json.loads(c["function"]["arguments"]),
                                                       indent=1, sort_keys=True),
                               "name": c["function"]["name"]}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    content = message.get("content")
    out["content"] = [{"type": "text", "text": content}] if isinstance(content, str) else None
    out["role"] = "assistant"
    return out


def followers(rng: random.Random, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """What the client adds after an answer: each call's result, or a user turn."""
    calls = reply.get("tool_calls") or []
    if not calls:
        return [{"role": "user", "content": [{"type": "text", "text": "go on"},
                                             {"type": "image_url", "image_url": {"url": "x"}}]}]  # fmt: skip
    return [
        {"role": "tool", "tool_call_id": c["id"], "content": "r" * rng.randint(0, 300)}
        for c in calls
    ]


def check(history: History, messages: list[Any], answers: list[dict[str, Any]]) -> None:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    want_prefix = None if last is None else history_hash(messages[: last + 1])
    assert history.prefix() == want_prefix
    for a in answers:
        assert history.continuation(a) == history_hash([*messages, {"role": "assistant", **a}])


def test_randomized_sessions_hash_as_the_definition_says():
    rng = random.Random(29)
    cache = ChainCache()
    for session in range(12):
        messages: list[Any] = [
            {"role": "system", "content": f"system {session % 3}"},
            {"role": "user", "content": [{"type": "text", "text": "task "}, {"type": "text", "text": str(session)}]},
        ]  # fmt: skip
        for step in range(rng.randint(1, 9)):
            n = rng.choice([1, 1, 2, 3])  # n > 1: each sample its own continuation
            answers = [answer(rng, step, s) for s in range(n)]
            history = History(json.loads(json.dumps(messages)), cache)  # parsed anew, as sent
            check(history, messages, answers)
            chosen = rng.choice(answers)
            messages = [*messages, resent(chosen), *followers(rng, chosen)]
    assert cache.hits > 30 and cache.misses == 0


def test_an_edited_history_misses_and_still_hashes_right():
    cache = ChainCache()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    first = {"role": "assistant", "content": "hello"}
    History(messages, cache).continuation(first)
    edited = [{"role": "user", "content": "hi!"}, first, {"role": "user", "content": "and?"}]
    check(History(edited, cache), edited, [{"role": "assistant", "content": "more"}])
    assert (cache.hits, cache.misses) == (0, 1)
    same = [{"role": "user", "content": "hi"}, first, {"role": "user", "content": "and?"}]
    check(History(same, cache), same, [])
    assert cache.hits == 1


def test_a_link_is_dropped_once_extended_and_evicted_past_its_bounds():
    cache = ChainCache(max_links=2)
    opening: list[Any] = [{"role": "user", "content": "x"}]
    for i in range(3):  # three histories, each one step long
        History([{"role": "user", "content": f"q{i}"}], cache).continuation(
            {"role": "assistant", "content": "a"}
        )
    assert len(cache) == 2  # the oldest went
    gone = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a"}]
    check(History(gone, cache), gone, [])
    assert cache.misses == 1
    kept = [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}]
    history = History(kept, cache)
    check(history, kept, [{"role": "assistant", "content": "b"}])
    assert cache.hits == 1 and len(cache) == 2  # q2's link replaced by its extension
    small = ChainCache(max_mb=1 / 2**20 * 300)  # 300 bytes
    History(opening, small).continuation({"role": "assistant", "content": "y" * 400})
    assert len(small) == 0 and small.size_bytes == 0
    off = ChainCache(max_mb=0)
    History(opening, off).continuation({"role": "assistant", "content": "y"})
    assert len(off) == 0


def test_a_fresh_cache_after_a_restart_gives_the_same_hashes():
    messages: list[Any] = [{"role": "user", "content": "x"}]
    links = []
    for cache in (ChainCache(), ChainCache()):  # the second: a writer just started
        history = History(messages, cache)
        links.append(history.continuation({"role": "assistant", "content": "y"}))
        nxt = [*messages, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}]
        check(History(nxt, cache), nxt, [{"role": "assistant", "content": "w"}])
    assert links[0] == links[1]


def test_a_named_session_resending_an_edited_answer_hashes_from_its_last_request():
    """The client sends back another answer than it got (a scripted agent, an SDK that
    rewrites it): no continuation matches, and the session's last request is extended
    instead of hashing the whole history again; the hashes are the definition's."""
    rng = random.Random(7)
    cache = ChainCache()
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    for step in range(8):
        got = answer(rng, step, 0)
        history = History(json.loads(json.dumps(messages)), cache, "tenant/s1")
        check(history, messages, [got])
        sent = {"role": "assistant", "content": f"scripted {step}"}  # not what it got
        messages = [*messages, sent, {"role": "user", "content": f"result {step}"}]
    assert cache.hits == 0 and cache.request_hits == 7
    # another session's name, or an edit before the last request's end: hashed whole
    check(History(messages, cache, "tenant/s2"), messages, [])
    edited = [{"role": "system", "content": "S"}, *messages[1:]]
    check(History(edited, cache, "tenant/s1"), edited, [])
    assert cache.request_hits == 7
    # a request that ends before its last assistant message: not extended, still right
    cut = messages[:3]
    check(History(cut, cache, "tenant/s1"), cut, [])


def test_the_last_requests_kept_are_bounded():
    cache = ChainCache(max_links=2)
    for i in range(3):
        History([{"role": "user", "content": f"q{i}"}], cache, f"s{i}")
    nxt = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a"}]
    check(History(nxt, cache, "s0"), nxt, [])  # s0's request went
    assert cache.request_hits == 0
    nxt = [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}]
    check(History(nxt, cache, "s2"), nxt, [])
    assert cache.request_hits == 1
    off = ChainCache(max_mb=0)
    History([{"role": "user", "content": "x"}], off, "s")
    assert off.last_request("s", [{"role": "user", "content": "x"}], 1) is None
