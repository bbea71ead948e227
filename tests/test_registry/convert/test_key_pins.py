"""The conversion key is what makes a conversion run again find its version: the same inputs must give the same
key byte for byte across releases of mreg, or every store's versions would be made again. These keys were
computed by mreg before its conversion options were typed (issue #29) and are hard-coded here."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import write_model

from converters.gguf.options import GGUFOptions
from converters.hf.converter import HFOptions
from manifests import SourceFile, SourceInfo
from registry import api
from registry.cli.convert import _tensorrt_fields
from registry.convert import execute, formats
from registry.convert.plan import AnyTarget, prepare, with_flags

SOURCE = SourceInfo(kind="hub", repo="org/pinned", requested_revision="main", commit="a" * 40,
                    files=(SourceFile(path="config.json", size=2, sha256="b" * 64),
                           SourceFile(path="model.safetensors", size=8, sha256="c" * 64)))
TOOLS = {"hf": {}, "gguf": {"numpy": "2.0.0", "gguf": "0.10.0"}, "onnx": {"onnx": "1.17.0"},
         "tensorrt": {"tensorrt-rtx": "1.0"}}


@pytest.fixture(autouse=True)
def fixed_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool versions are the environment's: pinned here, so that the key depends only on what the test gives."""
    for fmt, tools in TOOLS.items():
        monkeypatch.setattr(type(formats.get(fmt)), "tool_versions", lambda self, t=tools: dict(t))


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A legacy importance matrix and a calibration text of fixed bytes, in the working directory."""
    name = b"blk.0.attn_q.weight"
    (tmp_path / "pinned.imatrix.dat").write_bytes(
        struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii4f", 1, 4, 1, 2, 3, 4) + struct.pack("<ii", 1, 4)
        + b"pins")
    for calibration in ("calib.txt", "calib, v2.txt"):
        (tmp_path / calibration).write_text("A harbour town measures its tides. " * 40, encoding="utf-8")
    (tmp_path / "eval.txt").write_text("The tide rose twice a day. " * 20, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


SNAPSHOT: Any = SimpleNamespace(record=SimpleNamespace(source=SOURCE))


def key(*targets: AnyTarget) -> str:
    """The key `mreg convert SOURCE --to T...` computes for SOURCE."""
    return execute.planned(SNAPSHOT, prepare(targets))[2]


PINNED = {
    ("hf",): "52eb34606e99eb04868f73be82dc49b80428efd81ad719bec9e09e5cc98e5f0d",
    ("gguf",): "95f59ef304d86df5dd57be1919df61e1692dc417d073c0057be516fdae3cdb63",
    ("gguf:Q8_0",): "e4d6d883e87b531c3078f731145091bb065a075bfd9a1a3341a5e40483968bd0",
    ("gguf:q4_k_m",): "4400dd5532747b2efa0aae4f0fcc903c04fc628bb001680b7211b3f72d6e4aeb",
    ("gguf:Q4_K_M,calibration=default",): "2d69e85823fda2a4a0f90442a09ab200b1534918d132d828387bac0a275837b0",
    ("gguf:Q4_K_M,calibration=calib.txt,calibration-ctx=256",):
        "a692adaf53b0b972092475add90fb875c460242eeb67fd1c6258ae8ad8a4d9e3",
    ("gguf:IQ2_M,imatrix=pinned.imatrix.dat",): "efdbfd9d53840b861d01ae27d8366c5dc7b7b148757f6b515f3518ca0354cf66",
    # An importance matrix changes nothing in Q8_0: it is dropped from the options, so from the key.
    ("gguf:Q8_0,imatrix=pinned.imatrix.dat",): "e4d6d883e87b531c3078f731145091bb065a075bfd9a1a3341a5e40483968bd0",
    ("gguf:Q5_K_M,evaluation=default,tokens=64",): "28841d21267a42f059f4cf5228969596f8fbe465bcf81dd72b57b60b3903c46c",
    ("gguf:auto",): "a896e069ed35f42448f569d31cc805d83899c921d2344adcc88df4fed389c1f0",
    ("gguf:auto,kl=0.05,top1=0.9,calibration=default,calibration-ctx=128",):
        "9de59e72aabde9949e62e99fa53ba908c2c3a3372f844443865dfd65e04b7180",
    ("gguf:auto,ppl=1.02,imatrix=pinned.imatrix.dat,evaluation=default,tokens=256",):
        "45276ea5b47bf18516fb9677cdb4cb2ad119192c0c3b0c30d69c09912455313b",
    ("hf", "gguf:F16", "gguf:Q4_K_M,calibration=default"):
        "90d0a4ac6fdb416c50f00626fc8d88f5e4cb7388ae37cb5f72b6776739fddb12",
    ("onnx:fp16",): "7af3baf308b5cca30227da8a76c063cd1cea5f0874ff2aac1027d3f6d0fdb398",
    # TensorRT builds from ONNX: the key holds the ONNX target made first with its default options.
    ("tensorrt:target=sm_86",): "b33067216f2fc82c61ef2c40eb0942232b180728b5cb652f0cf1a082df8cf2de",
}


@pytest.mark.parametrize("targets", list(PINNED))
def test_keys_are_those_of_earlier_releases(targets: tuple[str, ...], files: Path) -> None:
    assert key(*targets) == PINNED[targets]


def test_an_evaluation_file_is_keyed_by_its_path_name_and_digest(files: Path) -> None:
    """The one option that holds a path (it depends on where the file lies, so its key is not pinned above)."""
    (_, prepared, _), = execute.planned(SNAPSHOT, prepare(["gguf:Q4_K_M,evaluation=eval.txt,tokens=100"]))[0]
    assert prepared.options == {"type": "Q4_K_M", "evaluation": {
        "text": "eval.txt", "path": str(files.resolve() / "eval.txt"), "max_tokens": 100,
        "sha256": "068d1f5f6be3f66b0db8093ed978e149a4040547f46af87cf4879061ceb70b9c"}}


def test_typed_options_give_the_keys_of_the_string_form(files: Path) -> None:
    """What the CLI's flags (and the API's callers) build is keyed as the string form was."""
    assert key(GGUFOptions(type="q4_k_m")) == PINNED[("gguf:q4_k_m",)]
    assert key(GGUFOptions(type="Q4_K_M", calibration="calib.txt", calibration_ctx="256")) \
        == PINNED[("gguf:Q4_K_M,calibration=calib.txt,calibration-ctx=256",)]
    assert key(GGUFOptions(type="IQ2_M", imatrix=str(files / "pinned.imatrix.dat"))) \
        == PINNED[("gguf:IQ2_M,imatrix=pinned.imatrix.dat",)]
    assert key(GGUFOptions(type="auto", budget=("ppl=1.02",), imatrix="pinned.imatrix.dat", evaluation="default",
                           tokens="256")) \
        == PINNED[("gguf:auto,ppl=1.02,imatrix=pinned.imatrix.dat,evaluation=default,tokens=256",)]
    assert key(HFOptions(), GGUFOptions(type="F16"), ("gguf", {"spec": "Q4_K_M,calibration=default"})) \
        == PINNED[("hf", "gguf:F16", "gguf:Q4_K_M,calibration=default")]


def test_tensorrt_flags_give_the_key_of_the_string_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """--backend/--target/--shapes/--precision set TensorRT's typed options (no spec string in between), each read
    by the spec's reader for its key: a shapes value is parsed once, by `parse_shapes`, and never again."""
    from converters.tensorrt import converter as trt

    read: list[str] = []
    real = trt.parse_shapes
    monkeypatch.setattr(trt, "parse_shapes", lambda text: read.append(text) or real(text))

    def flags(backend: str | None = None, target: str | None = None, shapes: str | None = None,
              precision: str | None = None) -> list[AnyTarget]:
        """`mreg convert … --to tensorrt --backend … --target … --shapes … --precision …`, as the CLI types it."""
        return list(with_flags(["tensorrt"], "tensorrt", _tensorrt_fields(backend, target, shapes, precision),
                               "--backend, --target, --shapes and --precision"))

    assert key(*flags(target="8.6")) == key(*flags(backend="tensorrt-rtx", target="sm_86", precision="fp32")) \
        == PINNED[("tensorrt:target=sm_86",)]
    flag_shapes = "input_ids=1x1:1x64:4x128, attention_mask=1x1:1x64:4x128"
    spec_shapes = "input_ids=1x1:1x64:4x128;attention_mask=1x1:1x64:4x128"
    spelled = f"tensorrt:target=sm_86+sm_89,precision=fp16,shapes={spec_shapes}"
    flagged = flags(target="sm_89, sm_86", shapes=flag_shapes, precision="fp16")
    typed = formats.get("tensorrt").parse({"spec": spelled.partition(":")[2]})
    assert flagged == [typed] and read == [flag_shapes, spec_shapes]
    assert prepare(flagged) == prepare([typed]) and key(*flagged) == key(typed)
    assert read == [flag_shapes, spec_shapes], "prepared and keyed without reading the shapes again"
    assert key(*flagged) == key(spelled)


def test_a_path_with_a_comma_is_taken_whole(files: Path) -> None:
    (prepared,) = prepare([GGUFOptions(type="Q4_K_M", calibration="calib, v2.txt")])
    assert prepared.options["calibration"]["name"] == "calib, v2.txt"
    assert prepared.files == {prepared.options["calibration"]["sha256"]: files.resolve() / "calib, v2.txt"}


#: The key the mreg before typed options gave `write_model(seed=7)` converted to hf (no tool versions in it).
PUBLISHED_HF_KEY = "83be73ffc0ba98253af7efe52256598130324ba38876cd973ee2298d580e3b29"


def test_a_version_published_before_is_reused(tmp_path: Path) -> None:
    src = write_model(tmp_path / "src", seed=7)
    store = api.open_local_store(tmp_path / "s")
    first = api.convert(str(src), ["hf"], name="m", store=store, cache=tmp_path / "c")
    assert first.version.manifest.key == PUBLISHED_HF_KEY
    again = api.convert(str(src), [HFOptions()], name="m", store=store, cache=tmp_path / "c")
    assert (again.reused, again.version.number) == (True, 1)
