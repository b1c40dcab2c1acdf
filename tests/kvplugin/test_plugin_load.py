"""The plugin as vLLM loads it: the entry point in the engine's environment, the scheduler
classes by the names --scheduler-cls takes, and loading twice."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gateway.config import EmbeddedSettings
from kvplugin.config import ENV_VAR, CompactionConfig

ENGINE = EmbeddedSettings().python

LOAD = """
import json
from importlib.metadata import entry_points
import vllm.plugins as plugins
from vllm.config.scheduler import SchedulerConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
import kvplugin

names = [e.value for e in entry_points(group="vllm.general_plugins")]
plugins.load_general_plugins()
first = (CPUModelRunner.execute_model, CPUAttentionBackendImpl.forward)
plugins.plugins_loaded = False  # vLLM loads plugins once per process; force a second load
plugins.load_general_plugins()
kvplugin._registered = False  # and run our register() again from scratch
kvplugin.register()
second = (CPUModelRunner.execute_model, CPUAttentionBackendImpl.forward)
classes = {}
for name in ("kvplugin.scheduler.CompactingAsyncScheduler", "kvplugin.scheduler.CompactingScheduler"):
    cls = SchedulerConfig.default_factory(scheduler_cls=name).get_scheduler_cls()
    classes[name] = [issubclass(cls, AsyncScheduler), issubclass(cls, Scheduler)]
print(json.dumps({"entry_points": names, "hooked": kvplugin.hooks_installed(),
                  "same_after_reload": first == second, "classes": classes}))
"""


def load(env: dict[str, str]) -> dict[str, object]:
    if not ENGINE.exists():
        pytest.skip(f"no engine environment at {ENGINE} (scripts/install.sh)")
    result = subprocess.run(
        [str(ENGINE), "-c", LOAD], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env}, cwd="/",  # the installed package, not this checkout's path
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def test_entry_point_and_scheduler_classes_load_twice() -> None:
    enabled = CompactionConfig(enabled=True, trigger_tokens=512, budget=0.5).to_env()
    data = load({ENV_VAR: enabled})
    assert "kvplugin:register" in data["entry_points"]
    assert data["hooked"] is True
    assert data["same_after_reload"] is True  # a second load wraps nothing twice
    assert data["classes"] == {
        "kvplugin.scheduler.CompactingAsyncScheduler": [True, True],
        "kvplugin.scheduler.CompactingScheduler": [False, True],
    }


def test_disabled_plugin_changes_nothing() -> None:
    data = load({ENV_VAR: ""})
    assert "kvplugin:register" in data["entry_points"]
    assert data["hooked"] is False
