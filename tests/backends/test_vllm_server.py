from __future__ import annotations

import json
from pathlib import Path

from backends.vllm_server import NGRAM_SPECULATION, VllmServerSpec, command, cpu_binds, environment


def spec(**kw) -> VllmServerSpec:
    return VllmServerSpec(
        name="full", model_dir=Path("/m"), served_model_name="smol", port=8101, **kw
    )


def test_command_uses_the_module_entry_point_and_explicit_kv_cache():
    argv = command(spec(), Path("/venv/bin/python"))
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--model") == "/m" and flag("--served-model-name") == "smol"
    assert flag("--kv-cache-memory-bytes") == str(256 * 1024 * 1024)
    assert flag("--host") == "127.0.0.1" and flag("--port") == "8101"
    assert "--enforce-eager" in argv and "--speculative-config" not in argv


def test_dtype_is_passed():
    argv = command(spec(dtype="float32"), Path("p"))
    assert argv[argv.index("--dtype") + 1] == "float32"


def test_speculative_config_is_json():
    argv = command(spec(speculative=NGRAM_SPECULATION), Path("p"))
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "ngram"


def test_environment_is_offline_and_bound():
    env = environment(spec(cpu_bind="1"), {"PATH": "/bin", "HF_HUB_OFFLINE": "0"})
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["PATH"] == "/bin"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in environment(spec(), {})


def test_cpu_binds_split_evenly():
    assert cpu_binds([0, 1], 2) == ["0", "1"]
    assert cpu_binds([0, 1, 2, 3, 4], 2) == ["0-1", "2-3"]
    assert cpu_binds([0], 2) == [None, None]
