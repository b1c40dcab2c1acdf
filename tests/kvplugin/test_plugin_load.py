"""The plugin as vLLM loads it: the entry point in the engine's environment, the scheduler
classes by the names --scheduler-cls takes, and loading twice."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.config import EmbeddedSettings
from kvplugin.config import ENV_VAR, CompactionConfig

ENGINE = EmbeddedSettings().python
ROOT = Path(__file__).resolve().parents[2]

LOAD = """
import json, os, sys
from importlib.metadata import entry_points
import vllm.plugins as plugins
from vllm.config.scheduler import SchedulerConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
import kvplugin

names = [e.value for e in entry_points(group="vllm.general_plugins")]
hooks = lambda: (CPUModelRunner.execute_model, CPUModelRunner.sample_tokens,
                 CPUAttentionBackendImpl.forward, OutputProcessor.process_outputs,
                 OpenAIServingChat.chat_completion_stream_generator,
                 OpenAIServingCompletion.completion_stream_generator)
hooked = lambda: [getattr(h, "_gearshift_kv", False) for h in hooks()]

def load():  # as a fresh process would: vLLM's loader, then our register() from scratch
    plugins.plugins_loaded = False
    kvplugin._registered = False
    plugins.load_general_plugins()

os.environ[sys.argv[1]] = ""  # disabled: vLLM's loader runs register(), which does nothing
load()
disabled = {"hooked": kvplugin.hooks_installed(), "hooks": hooked()}
os.environ[sys.argv[1]] = sys.argv[2]
load()
first = hooks()
load()  # a second load in the same process
kvplugin.register()
second = hooks()
classes = {}
for name in ("kvplugin.scheduler.CompactingAsyncScheduler", "kvplugin.scheduler.CompactingScheduler"):
    cls = SchedulerConfig.default_factory(scheduler_cls=name).get_scheduler_cls()
    classes[name] = [issubclass(cls, AsyncScheduler), issubclass(cls, Scheduler)]
print(json.dumps({"entry_points": names, "disabled": disabled, "hooked": kvplugin.hooks_installed(),
                  "hooks": hooked(), "same_after_reload": first == second, "classes": classes}))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, Any]:
    """One engine-environment process: the plugin loaded disabled, then enabled twice."""
    if not ENGINE.exists():
        pytest.skip(f"no engine environment at {ENGINE} (scripts/install.sh)")
    enabled = CompactionConfig(enabled=True, trigger_tokens=512, budget=0.5).to_env()
    result = subprocess.run(
        [str(ENGINE), "-c", LOAD, ENV_VAR, enabled], capture_output=True, text=True,
        timeout=300,
        # the installed entry point, run from elsewhere; the package is this checkout's,
        # wherever the engine's editable install points
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def test_entry_point_and_scheduler_classes_load_twice(loaded: dict[str, Any]) -> None:
    assert "kvplugin:register" in loaded["entry_points"]
    # worker, attention, sampling, the API server's output processor and stream generators
    assert loaded["hooked"] is True and loaded["hooks"] == [True] * 6
    assert loaded["same_after_reload"] is True  # a second load wraps nothing twice
    assert loaded["classes"] == {
        "kvplugin.scheduler.CompactingAsyncScheduler": [True, True],
        "kvplugin.scheduler.CompactingScheduler": [False, True],
    }


def test_disabled_plugin_changes_nothing(loaded: dict[str, Any]) -> None:
    assert loaded["disabled"] == {"hooked": False, "hooks": [False] * 6}
