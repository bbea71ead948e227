"""GGUF conversion benchmark (run by `python benchmarks/bench.py --only gguf`, part of `nox -s bench`).

A 1.1 B-parameter llama in the TinyLlama shape (hidden 2048, 22 layers, 32 heads, 4 KV heads,
intermediate 5632, vocab 32000, Llama 2's SentencePiece tokenizer), bf16, random weights, is pulled into
the cache once; then `mreg convert --to gguf:F16 | Q8_0 | Q4_K_M` runs as a process whose tree is
sampled for memory (see `_timed`), beside `cp` of the same input, llama.cpp's `convert_hf_to_gguf.py`
(from the llama-cpp-python source package) to F16 and Q8_0, and llama.cpp's `llama_model_quantize`
from mreg's F16 file (the second step of the reference path to Q4_K_M); last, all three types in one
`mreg convert` that reads the source once.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from support.cli import artifact

TINYLLAMA = {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
             "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048}
#: Llama 2 7B's shape (6.7 B parameters, 13.5 GB in bf16), for the first-run benchmark at 7 B.
LLAMA2_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}
TYPES = ("F16", "Q8_0", "Q4_K_M")


def _random_bf16(shape: tuple[int, ...], seed: int) -> Callable[[BinaryIO], None]:
    """A writer of N(0, 0.02) bf16 values, generated 4M at a time."""

    def write(f: BinaryIO) -> None:
        rng = np.random.default_rng(seed)
        left = int(np.prod(shape))
        while left:
            n = min(left, 1 << 22)
            v = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
            f.write((v >> 16).astype("<u2").tobytes())
            left -= n

    return write


def llama_shapes(h: int, inter: int, kv: int, layers: int, vocab: int, *,
                 tied: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The tensor names and shapes of a llama checkpoint (transformers' names), in file order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        pre = f"model.layers.{i}."
        shapes += [(pre + "self_attn.q_proj.weight", (h, h)), (pre + "self_attn.k_proj.weight", (kv, h)),
                   (pre + "self_attn.v_proj.weight", (kv, h)), (pre + "self_attn.o_proj.weight", (h, h)),
                   (pre + "mlp.gate_proj.weight", (inter, h)), (pre + "mlp.up_proj.weight", (inter, h)),
                   (pre + "mlp.down_proj.weight", (h, inter)), (pre + "input_layernorm.weight", (h,)),
                   (pre + "post_attention_layernorm.weight", (h,))]
    shapes.append(("model.norm.weight", (h,)))
    if not tied:
        shapes.append(("lm_head.weight", (vocab, h)))
    return shapes


def write_bf16_shards(dest: Path, shapes: list[tuple[str, tuple[int, ...]]]) -> None:
    """bf16 safetensors shards of about 1 GiB (matrices random, vectors ones), streamed, and their index."""
    from support.tiny_models import write_safetensors

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * int(np.prod(shape))
        if size + nbytes > 1 << 30 and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    index: dict[str, str] = {}
    for k, group in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = []
        for j, (name, shape) in enumerate(group):
            if len(shape) == 1:
                data: Any = (np.ones(shape, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            else:
                data = _random_bf16(shape, 1000 * k + j)
            tensors.append((name, "BF16", shape, data))
            index[name] = fname
        write_safetensors(dest / fname, tensors, {"format": "pt"})
    total = sum(2 * int(np.prod(s)) for _, s in shapes)
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": index}, indent=2))


def llama2_tokenizer(dest: Path, llama_cpp: Path | None) -> str:
    """A tiny llama directory carrying Llama 2's tokenizer, its weights removed; which tokenizer it has.

    Llama 2's tokenizer is a SentencePiece model (32 000 pieces); llama.cpp's vocabulary file of it,
    written back as tokenizer.model, is that tokenizer. Without llama.cpp's source, a SentencePiece
    model trained on the test corpus stands in (400 pieces: the prompt that verification evaluates is
    then twice as many tokens).
    """
    from support.llama_cpp_source import build_model, read_vocab
    from test_converters.conftest import build_spm_llama

    if llama_cpp is not None:
        build_model(read_vocab(llama_cpp, "llama-spm"), dest, dtype="bfloat16")
        tokenizer = "Llama 2's SentencePiece (32000 pieces), from llama.cpp's models/ggml-vocab-llama-spm.gguf"
    else:
        build_spm_llama(dest, dtype="bfloat16")
        tokenizer = "SentencePiece trained on the test corpus (400 pieces): llama.cpp's source unavailable"
    for p in dest.glob("*.safetensors*"):
        p.unlink()
    return tokenizer


def build_tinyllama(dest: Path, llama_cpp: Path | None, shape: dict[str, int] = TINYLLAMA) -> tuple[Path, str]:
    """The TinyLlama-shaped bf16 checkpoint (TinyLlama's tokenizer is Llama 2's), weights streamed to disk,
    and which tokenizer it has; `shape`: another Llama 2-tokenized shape (LLAMA2_7B)."""
    tokenizer = llama2_tokenizer(dest, llama_cpp)
    c = shape
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    write_bf16_shards(dest, llama_shapes(h, inter, kv, c["num_hidden_layers"], v, tied=False))
    config = json.loads((dest / "config.json").read_text())
    config.update(c, head_dim=h // c["num_attention_heads"], tie_word_embeddings=False)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return at_rest(dest), tokenizer


def at_rest(directory: Path) -> Path:
    """Files an hour old: mreg re-hashes a local checkpoint written seconds before its last pull."""
    old = time.time() - 3600
    for f in directory.iterdir():
        os.utime(f, (old, old))
    return directory


def _convert_hf_to_gguf(src: Path, dest: Path, outtype: str) -> list[str]:
    """llama.cpp's converter on src (run in the extracted source, with its own gguf-py first on the path)."""
    return [sys.executable, "convert_hf_to_gguf.py", str(src), "--outfile", str(dest), "--outtype", outtype]


def _tree(pid: int) -> list[int]:
    """A process and its descendants, from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
    return out


def _status_kb(pid: int) -> dict[str, int]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines)
            if k in ("VmRSS", "RssAnon", "RssFile")}


#: What the timed commands import (mreg's and llama.cpp's converters alike), read back in after a drop.
_IMPORTS = "import numpy, torch, transformers, safetensors, sentencepiece, tokenizers, gguf, llama_cpp"


def settle(warm: Sequence[Path], imports: Sequence[str] = (sys.executable, "-c", _IMPORTS)) -> None:
    """The same start for every timed step: writeback done, page cache dropped, the step's input read in.

    Earlier steps leave gigabytes of page cache behind; reclaiming it lands on whichever step runs
    next (this machine's F16 write phase varied from 2.4 to 5.9 s with it). After the drop the Python
    libraries both tools import are loaded once (torch alone is 750 MB on disk), so that no step pays
    a cold start the other tool does not. Where the cache cannot be dropped (not root), only the
    sync and the reads happen. `imports` is the command that loads them (another tool's venv may
    have its own).
    """
    subprocess.run(["sync"], check=False)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    subprocess.run(list(imports), check=False, capture_output=True)
    for root in warm:
        # (a cache's snapshot entries are links to its blobs: each file is read once, through the blob)
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
        for f in sorted(files):
            with open(f, "rb") as fh:
                while fh.read(1 << 23):
                    pass


def _timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None,
           warm: Sequence[Path] = ()) -> tuple[float, dict[str, float], str]:
    """Wall seconds, memory figures in MB and stdout of a command, started after `settle(warm)`."""
    settle(warm)
    return sampled(cmd, env, cwd)


def sampled(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, dict[str, float], str]:
    """Wall seconds, memory figures in MB and stdout of a command, started as the machine is.

    The process tree is sampled every 20 ms: `peak_rss_mb` is the largest resident set of one process
    (what GNU time's %M reports), `peak_anon_mb` the largest sum of anonymous memory over the tree
    (heap and buffers: what a model's size could make grow), `peak_file_mb` the largest sum of
    file-backed resident pages (mapped files, which the kernel can drop and re-read).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = {"rss": 0, "anon": 0, "file": 0}
    while proc.poll() is None:
        stats = [_status_kb(p) for p in _tree(proc.pid)]
        peak["rss"] = max([peak["rss"], *(s.get("VmRSS", 0) for s in stats)])
        peak["anon"] = max(peak["anon"], sum(s.get("RssAnon", 0) for s in stats))
        peak["file"] = max(peak["file"], sum(s.get("RssFile", 0) for s in stats))
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
    return wall, {f"peak_{k}_mb": round(v / 1024) for k, v in peak.items()}, stdout


def _memory_cgroup(name: str, limit_mb: int) -> Path | None:
    """A memory cgroup (v2, else v1) limited to `limit_mb`, page cache included, or None where none can be made."""
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.subtree_control"
    candidates = [(Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes")]
    if controllers.is_file() and "memory" in controllers.read_text().split():
        candidates.insert(0, (v2, "memory.max"))
    for root, limit_file in candidates:
        group = root / name
        try:
            group.mkdir(exist_ok=True)
            (group / limit_file).write_text(str(limit_mb * 1024 * 1024))
        except OSError:
            continue
        return group
    return None


def _capped(cmd: list[str], env: dict[str, str], limit_mb: int, cwd: Path | None = None) -> dict[str, Any]:
    """Run a command inside a memory cgroup of `limit_mb`: does it finish, or is it killed for memory?"""
    group = _memory_cgroup(f"mreg-bench-{os.getpid()}", limit_mb)
    if group is None:
        return {"skipped": "no writable memory cgroup here (needs root)"}
    procs = str(group / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    subprocess.run(["sync"], check=False)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, preexec_fn=enter, check=False)
    wall = time.perf_counter() - t0
    events = group / ("memory.events" if (group / "memory.events").exists() else "memory.oom_control")
    killed = {k: int(v) for k, v in (line.split() for line in events.read_text().splitlines()
                                     if line.startswith("oom_kill"))}
    group.rmdir()
    return {"limit_mb": limit_mb, "exit": done.returncode, "s": round(wall, 2),
            "oom_kills": killed.get("oom_kill", 0)}


def llama_quantize_cmd(src: Path, dest: Path, ftype: int = 15) -> list[str]:
    """llama.cpp's own llama_model_quantize (2 threads) through llama-cpp-python: the reference second step."""
    code = ("import ctypes, sys, llama_cpp\n"
            "p = llama_cpp.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]); p.nthread = 2\n"
            "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")
    return [sys.executable, "-c", code, str(src), str(dest), str(ftype)]


def _llama_quantize(src: Path, dest: Path, env: dict[str, str], ftype: int = 15) -> float | None:
    """llama_model_quantize's wall seconds (None where it fails), same machine and moment as mreg's runs."""
    try:
        wall, _, _ = _timed(llama_quantize_cmd(src, dest, ftype), env, warm=[src])
    except subprocess.CalledProcessError:
        return None
    dest.unlink(missing_ok=True)
    return round(wall, 2)


def _mreg_convert(mreg: str, src: Path, types: tuple[str, ...], name: str, env: dict[str, str],
                  work: Path) -> tuple[float, dict[str, float], list[dict[str, Any]]]:
    """`mreg convert` timed after `settle` (the cache read in): wall, memory and the artifact records."""
    targets = [a for t in types for a in ("--to", f"gguf:{t}")]
    wall, mem, stdout = _timed([mreg, "convert", str(src), *targets, "--name", name, "--json"], env,
                               warm=[Path(env.get("MREG_CACHE_DIR", work / "gguf-cache"))])
    doc = json.loads(stdout)
    manifest = json.loads((Path(env.get("MREG_STORE", work / "gguf-store")) / "models" / name / "versions"
                           / str(doc["version"]) / "manifest.json").read_text())
    return wall, mem, manifest["artifacts"]


def llama_cpp_or_none(work: Path, bench: str) -> Path | None:
    """llama.cpp's source in `work` (fetched from PyPI if need be), or None with a line saying what is lost."""
    from support.llama_cpp_source import Unavailable, source

    try:
        return source(work / "llama-cpp-source", allow_download=True)
    except Unavailable as e:
        print(f"{bench}: no llama.cpp source ({e}): no convert_hf_to_gguf.py figures", flush=True)
        return None


def bench_gguf(work: Path, results: dict[str, Any]) -> None:
    """mreg convert to F16, Q8_0 and Q4_K_M on a 1.1 B bf16 llama, against cp and llama.cpp's own tools."""
    llama_cpp = llama_cpp_or_none(work, "gguf")
    src, tokenizer = build_tinyllama(work / "tinyllama", llama_cpp)
    nbytes = sum(p.stat().st_size for p in src.iterdir())
    mreg = str(Path(sys.executable).parent / "mreg")
    env = {**os.environ, "MREG_CACHE_DIR": str(work / "gguf-cache"), "MREG_STORE": str(work / "gguf-store")}
    ref_env = {**env, "PYTHONPATH": "gguf-py"}
    t_cp, _, _ = _timed(["cp", "-r", str(src), str(work / "cp-copy")], env, warm=[src])
    t_pull, mem_pull, _ = _timed([mreg, "pull", str(src), "--json"], env, warm=[src])
    out: dict[str, Any] = {"tokenizer": tokenizer, "source_bytes": nbytes, "cp_s": round(t_cp, 2),
                           "pull_s": round(t_pull, 2),
                           "pull_memory": mem_pull}
    for qtype in TYPES:
        # Twice each for F16 and Q8_0 (mreg and llama.cpp alike), the faster run kept: this disk's
        # writeback makes single runs vary by a second. Each run starts from `settle`.
        runs = [_mreg_convert(mreg, src, (qtype,), f"b-{qtype.lower()}-{i}", env, work)
                for i in range(1 if qtype == "Q4_K_M" else 2)]
        wall, mem, (art,) = min(runs, key=lambda r: r[0])
        metrics = art["verification"]["metrics"]
        row: dict[str, Any] = {
            "convert_s": round(wall, 2), **mem, "write_s": metrics.get("write_seconds"),
            "verify_s": metrics.get("verify_seconds"), "reference_s": metrics.get("reference_seconds"),
            "file_bytes": art["files"][0]["size"], "verification": art["verification"]["status"],
            "kl_divergence": metrics.get("kl_divergence"), "top1_agreement": metrics.get("top1_agreement"),
            "ratio_to_cp": round(wall / t_cp, 1)}
        if llama_cpp is not None and qtype in ("F16", "Q8_0"):
            ref_out = work / f"ref-{qtype}.gguf"
            ref_runs = []
            for _ in range(2):
                ref_runs.append(_timed(_convert_hf_to_gguf(src, ref_out, qtype.lower()), ref_env, cwd=llama_cpp,
                                       warm=[src]))
                ref_out.unlink(missing_ok=True)
            ref_s, ref_mem, _ = min(ref_runs, key=lambda r: r[0])
            row["convert_hf_to_gguf"] = {"s": round(ref_s, 2), **ref_mem,
                                         "runs_s": [round(r[0], 2) for r in ref_runs]}
            row["ratio_to_convert_hf_to_gguf"] = round(wall / ref_s, 2)
        row["runs_s"] = [round(r[0], 2) for r in runs]
        out[qtype] = row
        print(f"gguf {qtype}: {row}", flush=True)
        if qtype == "F16":
            first, tree = artifact(work / "gguf-store", "b-f16-0", 1, "gguf")  # the first run's file
            f16 = tree / first["files"][0]["path"]
            out["llama_quantize_F16_to_Q4_K_M_s"] = _llama_quantize(f16, work / "ref-Q4_K_M.gguf", env)
            out["llama_quantize_F16_to_Q8_0_s"] = _llama_quantize(f16, work / "ref-Q8_0.gguf", env, ftype=7)
    # The claim itself: each conversion, verification included, inside 500 MB (page cache counted).
    capped: dict[str, Any] = {}
    for qtype in TYPES:
        capped[f"mreg {qtype}"] = _capped([mreg, "convert", str(src), "--to", f"gguf:{qtype}", "--name",
                                           f"c-{qtype.lower()}", "--json"], env, 500)
    if llama_cpp is not None:
        ref_out = work / "ref-capped.gguf"
        capped["convert_hf_to_gguf F16"] = _capped(_convert_hf_to_gguf(src, ref_out, "f16"), ref_env, 500,
                                                   cwd=llama_cpp)
        ref_out.unlink(missing_ok=True)
    out["under_500_mb"] = capped
    print(f"gguf under 500 MB: {capped}", flush=True)
    wall, mem, arts = _mreg_convert(mreg, src, TYPES, "b-all", env, work)
    out["all_three_in_one_run"] = {"convert_s": round(wall, 2), **mem,
                                   "separate_runs_s": round(sum(out[t]["convert_s"] for t in TYPES), 2),
                                   "verification": [a["verification"]["status"] for a in arts]}
    results["gguf_1.1B"] = out
    print(f"gguf: {out}", flush=True)
