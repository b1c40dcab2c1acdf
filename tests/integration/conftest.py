"""The gateway on a real loopback socket, in front of fault-injecting fake replicas."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import Settings
from gateway.http.app import create_app
from gateway.metrics import Metrics
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

FULL_MODEL = "model-full"
FAST_MODEL = "model-fast"


@dataclass
class Stack:
    url: str
    metrics: Metrics
    spans: InMemorySpanExporter
    store_url: str

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", "unused")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url + "/v1", **kwargs)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def wait_metric(
        self, name: str, labels: dict[str, str], value: float, timeout: float = 5.0
    ) -> None:
        """Stream metrics are recorded when the relay finishes, just after the client's last
        byte, so a test that reads them right away must give the server that moment."""
        deadline = time.monotonic() + timeout
        while self.metric(name, labels) != value:
            assert time.monotonic() < deadline, (
                f"{name}{labels} = {self.metric(name, labels)}, wanted {value}"
            )
            time.sleep(0.01)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


Replica = FakeUpstream | str


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    with contextlib.ExitStack() as stack:

        def build(
            full: list[Replica], fast: list[Replica] | None = None, **overrides: Any
        ) -> Stack:
            def urls(replicas: list[Replica]) -> list[str]:
                return [
                    r if isinstance(r, str) else stack.enter_context(serve_in_thread(r.app))
                    for r in replicas
                ]

            tiers = {"full": {"model": FULL_MODEL, "replicas": urls(full)}}
            if fast is not None:
                tiers["fast"] = {"model": FAST_MODEL, "replicas": urls(fast)}
            config: dict[str, Any] = {
                "tiers": tiers,
                "timeouts": {"connect_s": 1, "first_byte_s": 5, "between_chunks_s": 5},
                "retries": {"attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.05},
                # A stand-in that says 503 or is gone is ejected at once; one that is merely
                # slow to answer a probe on a loaded machine (it shares this process's GIL)
                # is not: CI once lost its only replica to a probe that took over 0.5 s.
                "health": {"interval_s": 0.2, "timeout_s": 3.0, "unhealthy_after": 1},
                # a policy whose choice these tests can predict; the trained default is
                # tested on its own (tests/router, test_routing_session.py, e2e)
                # (and counting tokens as the default family does: the stand-ins' /tokenize
                # counts code points, and a fit to it would change routing mid-test)
                "router": {"policy": "length_threshold", "calibrate_tokens": False},
                "store": {
                    "url": f"sqlite:///{tmp_path}/trajectories.db",
                    "dead_letter_path": str(tmp_path / "dead-letter.jsonl"),
                },
            }
            for key, value in overrides.items():
                config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
            metrics = Metrics()
            spans = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(spans))
            app = create_app(Settings(**config), metrics=metrics, tracer_provider=provider)
            url = stack.enter_context(serve_in_thread(app))
            return Stack(url, metrics, spans, config["store"]["url"])

        yield build
