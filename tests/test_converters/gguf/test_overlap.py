"""The reference pass beside the write (`converters.gguf.overlap`): used, waited for, never a way around a check."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import artifact

pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")


def _nothing_published(store_root: Path) -> bool:
    return not (store_root / "models" / "m" / "versions").exists()


def test_the_reference_runs_beside_the_write_and_its_logits_are_compared(mreg: Any, store_root: Path,
                                                                         tiny_model: Callable[..., Path]) -> None:
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:F16", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr
    art, _ = artifact(store_root, "m", 1, "gguf")
    metrics = art["verification"]["metrics"]
    assert art["verification"]["status"] == "passed"
    assert metrics["reference_overlapped"] == 1.0 and metrics["reference_seconds"] > 0
    assert metrics["kl_divergence"] <= 1e-3 and metrics["logits_positions"] > 1


def test_a_damaged_file_still_fails_when_the_reference_ran_ahead(mreg: Any, store_root: Path,
                                                                  tiny_model: Callable[..., Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's bytes are overwritten after the write (its digest no longer says what it holds): the checks
    that read it back fail it, the reference pass having run beside the write changes nothing."""
    from converters.gguf.converter import GGUFConverter

    real = GGUFConverter._write

    def damaged(*args: Any) -> Any:
        written, seconds = real(*args)
        (dest,) = args[1]
        size = dest.stat().st_size
        with open(dest, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\x7b" * (size // 4))  # F16 0x7b7b: 64864, in every tensor of the file's third quarter
        return written, seconds

    monkeypatch.setattr(GGUFConverter, "_write", staticmethod(damaged))
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:F16", "--name", "m", "--json")
    assert r.exit_code == 4 and r.json["error"]["type"] == "IntegrityError", r.stderr
    details = r.json["error"]["details"]["verification"]
    assert "differs from what was written" in details["detail"]
    assert "logits differ" in details["detail"] or "KL divergence" in details["detail"]
    assert _nothing_published(store_root)


def test_the_verification_waits_for_a_running_pass(tmp_path: Path) -> None:
    from converters.gguf import overlap

    cache = tmp_path / "ref.npz"
    overlap.wait_for(cache)  # no pass started: at once
    fd = os.open(overlap.lock_path(cache), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    waited = threading.Event()

    def wait() -> None:
        overlap.wait_for(cache)
        waited.set()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    assert not waited.is_set(), "read before the pass let go of its lock"
    os.close(fd)
    t.join(5)
    assert waited.is_set()


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(c) for c in task.read_text().split()]
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not Path(f"/proc/self/task/{os.getpid()}/children").exists(),
                    reason="reads the process tree from /proc (Linux, CONFIG_PROC_CHILDREN)")
def test_a_killed_conversion_leaves_no_pass_running_and_nothing_published(mreg: Any, store_root: Path,
                                                                         tiny_model: Callable[..., Path]) -> None:
    """SIGKILL while the file is written and the pass runs: the pass dies with it, no version is visible, and the
    next conversion sweeps the staging tree and publishes."""
    src = tiny_model("llama")
    # The write is held open (a sleep after it) so that the kill lands while both run.
    code = textwrap.dedent("""
        import sys, time
        from converters.gguf.converter import GGUFConverter
        real = GGUFConverter._write
        def slow(*args):
            out = real(*args)
            time.sleep(60)
            return out
        GGUFConverter._write = staticmethod(slow)
        from registry.cli import run
        sys.argv = ["mreg", *sys.argv[1:]]
        run()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, "convert", str(src), "--to", "gguf:F16", "--name", "m"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    ahead: list[int] = []
    while not ahead and time.monotonic() < deadline and proc.poll() is None:
        ahead = [c for c in _children(proc.pid) if "--reference" in _cmdline(c)]
        time.sleep(0.01)
    assert ahead, "the reference pass did not start beside the write"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{ahead[0]}").exists() and "--reference" in _cmdline(ahead[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "--reference" not in _cmdline(ahead[0]), "the reference pass outlived the killed conversion"
    assert _nothing_published(store_root)
    r = mreg("convert", src, "--to", "gguf:F16", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["version"] == 1
    assert not [p for p in (store_root / "tmp").glob("stage-*") if p.is_dir()], "the killed run's tree is swept"


def test_the_file_is_durable_before_the_registry_gets_it(mreg: Any, tiny_model: Callable[..., Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The fsync runs beside the verification, and is over when the converter hands the file on."""
    from converters.gguf.converter import GGUFConverter
    from registry import atomic

    synced: list[str] = []
    real_fsync, real_convert = atomic.fsync_file, GGUFConverter.convert_many

    def fsync_file(path: Path) -> None:
        real_fsync(path)
        synced.append(Path(path).name)

    def convert_many(self: Any, requests: Any) -> Any:
        results = real_convert(self, requests)
        assert synced == ["m-F16.gguf"], "handed on before its fsync was over"
        return results

    monkeypatch.setattr(atomic, "fsync_file", fsync_file)
    monkeypatch.setattr(GGUFConverter, "convert_many", convert_many)
    r = mreg("convert", tiny_model("llama"), "--to", "gguf:F16", "--name", "m", "--json")
    assert r.exit_code == 0, r.stderr
