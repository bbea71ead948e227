"""Real engines following the promoted path: llama.cpp's OpenAI-compatible server and an ONNX Runtime loop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _direct_completion(gguf: Path, prompt: str) -> str:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=256, seed=0, verbose=False)
    try:
        text: str = llm.create_completion(prompt, max_tokens=8, temperature=0.0, top_k=1)["choices"][0]["text"]
        return text
    finally:
        llm.close()


@pytest.fixture
def llama_server(tmp_path: Path, store_root: Path) -> Iterator[dict[str, Any]]:
    """Scripts that (re)start `python -m llama_cpp.server` on the promoted GGUF path, and its URL."""
    pytest.importorskip("llama_cpp.server.app")
    port = _free_port()
    mreg_bin = Path(sys.executable).parent / "mreg"
    pid = tmp_path / "server.pid"
    log = tmp_path / "server.log"
    start = tmp_path / "start.sh"
    start.write_text(
        f"#!/bin/sh\n[ -f {pid} ] && kill $(cat {pid}) 2>/dev/null && sleep 0.5\n"
        # A launcher asks mreg for the one path it needs, then starts the engine on it.
        f"model=$({mreg_bin} resolve tl@production --format gguf --store {store_root}) || exit 1\n"
        f"setsid {sys.executable} -m llama_cpp.server --model $model --host 127.0.0.1 --port {port} "
        f"--n_ctx 256 --seed 0 >> {log} 2>&1 < /dev/null &\necho $! > {pid}\n")
    start.chmod(0o755)
    yield {"start": str(start), "url": f"http://127.0.0.1:{port}", "log": log}
    if pid.exists():
        subprocess.run(["sh", "-c", f"kill $(cat {pid}) 2>/dev/null"], check=False)


@pytest.mark.slow
def test_llama_cpp_server_follows_promotions_and_survives_a_bad_one(mreg: Any, tmp_path: Path, store_root: Path,
                                                                    llama_server: dict[str, Any]) -> None:
    from support.tiny_models import build_tiny_llama

    for seed in (1, 2):
        src = build_tiny_llama(tmp_path / f"llama{seed}", seed=seed)
        assert mreg("convert", src, "--to", "gguf:F16", "--name", "tl").exit_code == 0
    assert mreg("convert", src, "--to", "hf", "--name", "tl").exit_code == 0  # v3: no GGUF, the engine cannot load it
    expected = {v: _direct_completion(next((store_root / f"models/tl/versions/{v}/gguf").glob("*.gguf")), "Hello")
                for v in (1, 2)}
    assert expected[1] != expected[2]
    url = llama_server["url"]
    hooks = ["--reload", llama_server["start"], "--ready-url", f"{url}/v1/models", "--ready-timeout", "60"]
    assert mreg("promote", "tl@1", *hooks).exit_code == 0, llama_server["log"].read_text()

    def served() -> str:
        text: str = _post(f"{url}/v1/completions", {"prompt": "Hello", "max_tokens": 8, "temperature": 0.0,
                                                     "top_k": 1})["choices"][0]["text"]
        return text

    assert served() == expected[1]
    assert mreg("promote", "tl@2", *hooks, "--json").json["hooks"]["ready"] is True
    assert served() == expected[2], "after the reload hook the server answers with version 2"
    short = ["--reload", llama_server["start"], "--ready-url", f"{url}/v1/models", "--ready-timeout", "8"]
    r = mreg("promote", "tl@3", *short, "--json")
    assert r.exit_code == 10 and "flipped back to 2" in r.json["error"]["message"]
    deadline = time.monotonic() + 60
    while True:
        try:
            assert served() == expected[2], "after the flip-back the server answers with version 2 again"
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    hist = mreg("history", "tl", "--json").json["entries"]
    assert [(e["action"], e["to"]) for e in hist][-2:] == [("promote", 3), ("rollback", 2)]
    assert os.readlink(store_root / "models/tl/production") == "versions/2"


class OrtEngine:
    """A small ONNX Runtime serving loop: loads `<mount>/onnx/model.onnx` on /reload, answers /infer and /ready."""

    def __init__(self, mount: Path) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import numpy as np
        import onnxruntime as ort

        self.mount, self.session, self.np, self.ort = mount, None, np, ort
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                engine.reload()
                self._send(200, {"loaded": engine.session is not None})

            def do_GET(self) -> None:
                if self.path == "/ready":
                    self._send(200 if engine.session is not None else 503, {})
                else:
                    self._send(200, engine.infer())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reload(self) -> None:
        """Open the model at the mount path; if it cannot be opened, serve nothing (not ready)."""
        try:
            self.session = self.ort.InferenceSession(str(self.mount / "onnx" / "model.onnx"),
                                                     providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - any load failure leaves the engine not ready
            self.session = None

    def infer(self) -> list[float]:
        """The first values of the first output for a fixed input."""
        assert self.session is not None
        feeds = {}
        for i in self.session.get_inputs():
            feeds[i.name] = self.np.array([[2, 7, 11, 5]], dtype=self.np.int64) if "input_ids" in i.name else (
                self.np.ones((1, 4), dtype=self.np.int64) if "attention" in i.name else
                self.np.zeros((1, 4), dtype=self.np.int64))
        out = self.session.run(None, feeds)[0]
        return [round(float(x), 5) for x in out.reshape(-1)[:8]]

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()


@pytest.mark.slow
def test_onnx_runtime_loop_reloads_on_the_hook(mreg: Any, tmp_path: Path, store_root: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from support.tiny_models import build_tiny_bert

    for seed in (1, 2):
        src = build_tiny_bert(tmp_path / f"bert{seed}", seed=seed)
        r = mreg("convert", src, "--to", "onnx", "--name", "enc")
        assert r.exit_code == 0, r.stderr
    assert mreg("convert", src, "--to", "hf", "--name", "enc").exit_code == 0  # v3 has no ONNX model
    engine = OrtEngine(store_root / "models" / "enc" / "production")
    try:
        hooks = ["--reload-url", f"{engine.url}/reload", "--ready-url", f"{engine.url}/ready",
                 "--ready-timeout", "3"]
        assert mreg("promote", "enc@1", *hooks).exit_code == 0
        first = engine.infer()
        assert mreg("promote", "enc@2", *hooks).exit_code == 0
        second = engine.infer()
        assert first != second, "the reload hook made the loop serve version 2"
        assert mreg("promote", "enc@3", *hooks).exit_code == 10
        assert engine.infer() == second, "after the flip-back the loop serves version 2 again"
        assert mreg("mount-check", "enc", "--json").json["paths"]["onnx"].endswith("production/onnx/model.onnx")
    finally:
        engine.close()


@pytest.mark.slow
def test_triton_repository_for_an_onnx_version(mreg: Any, tmp_path: Path, store_root: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("torch")
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format
    from support.tiny_models import build_tiny_bert

    for seed in (1, 2):
        assert mreg("convert", build_tiny_bert(tmp_path / f"b{seed}", seed=seed), "--to", "onnx",
                    "--name", "enc").exit_code == 0
    repo = store_root / "triton"
    r = mreg("export", "triton", "enc@1", "--repo", repo, "--json")
    assert r.exit_code == 0, r.stderr
    cfg = text_format.Parse((repo / "enc" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 8 and cfg.HasField("dynamic_batching")
    assert {i.name for i in cfg.input} >= {"input_ids", "attention_mask"}
    assert all(list(i.dims) == [-1] for i in cfg.input), "batch is implicit, sequence is dynamic"
    assert list(cfg.version_policy.specific.versions) == [1]
    one = repo / "enc" / "1"
    assert (one / "model.onnx").is_symlink() and not os.path.isabs(os.readlink(one / "model.onnx"))
    assert (one / "model.onnx").resolve() == (store_root / "models/enc/versions/1/onnx/model.onnx").resolve()
    assert (one / "model.onnx.data").exists(), "the external data file sits beside the model, as ORT expects"
    assert mreg("export", "triton", "enc@2", "--repo", repo).exit_code == 0
    cfg = text_format.Parse((repo / "enc" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert list(cfg.version_policy.specific.versions) == [2] and (repo / "enc" / "2" / "model.onnx").exists()
    assert not [p for p in (repo / "enc").iterdir() if p.name.startswith(".")], "no half-built version directory"
