"""OCI benchmark (run by `python benchmarks/bench.py --only oci [--oci-gb N]`, part of `nox -s bench`).

A version of N GB (default 2; four safetensors shards of random bytes, each one U8 tensor under a valid
header, plus config.json and the shard index) is registered once; then, each as its own process on the
same loopback distribution registry (a fresh repository per tool, so every byte goes over the wire)
and in the same run, first runs included:

- mreg: `mreg push` to the registry, `mreg push` again (bytes it uploads: must be 0), `mreg pull` into
  a fresh cache (every layer verified);
- skopeo: `skopeo copy oci:LAYOUT docker://…` of an OCI layout holding the same blobs (written by
  `mreg push … oci-layout:`, not timed), and `skopeo copy docker://… oci:DIR` back;
- oras-py (ORAS's Python client, the `oras` package): `push` of the same files and `pull` into a fresh
  directory, with its defaults (a single PUT per file) and with `do_chunked=True`.

Each figure is wall time and the process's own peak RSS (VmHWM, sampled: see `measured`). skopeo and
oras get a home of their own, so no blob-info cache lets them skip an upload.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: oras-py as a child process: push or pull of the files given, with its defaults or chunked.
_ORAS = """
import sys
from oras.client import OrasClient
action, host, target, chunked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
client = OrasClient(hostname=host, insecure=True)
if action == "push":
    client.push(target=target, files=sys.argv[5:], do_chunked=chunked, chunk_size=16 << 20)
else:
    client.pull(target=target, outdir=sys.argv[5])
"""


def random_model(dest: Path, total: int, shards: int = 4) -> Path:
    """`shards` safetensors files of random bytes adding up to about `total`, with config.json and the index."""
    dest.mkdir(parents=True)
    each = total // shards
    weight_map: dict[str, str] = {}
    for k in range(1, shards + 1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        tensor = f"shard{k}.weight"
        header = json.dumps({tensor: {"dtype": "U8", "shape": [each], "data_offsets": [0, each]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(dest / name, "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header)
            left = each
            while left:
                block = os.urandom(min(left, 16 << 20))
                f.write(block)
                left -= len(block)
        weight_map[tensor] = name
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": each * shards},
                                                                   "weight_map": weight_map}))
    (dest / "config.json").write_text(json.dumps({"model_type": "llama", "bench": "oci"}))
    return dest


def _hwm_kb(pid: int) -> int:
    """The process's own peak resident set (VmHWM, kB): per address space, so it restarts at exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def measured(cmd: list[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Wall time, peak RSS (MB) and stdout of one process, which must succeed.

    The peak is VmHWM sampled every 20 ms until the process exits, not wait4's ru_maxrss: Linux carries the
    forking parent's resident set (this benchmark's Python) into the child's ru_maxrss across exec, so every
    tool smaller than the parent would read as the parent's size.
    """
    t0 = time.perf_counter()
    with open(os.devnull, "rb") as null, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([str(c) for c in cmd], stdin=null, stdout=out, stderr=err, env=env, cwd=cwd)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _hwm_kb(proc.pid))
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {stderr.decode(errors='replace')[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 1024, 1), "stdout": stdout.decode()}


def _figure(m: dict[str, Any], nbytes: int) -> dict[str, Any]:
    return {"wall_s": m["wall_s"], "MBps": round(nbytes / 1e6 / m["wall_s"], 1) if m["wall_s"] else None,
            "peak_rss_mb": m["peak_rss_mb"]}


def bench_oci(work: Path, results: dict[str, Any], gb: float = 2.0) -> None:
    """mreg push / re-push / pull through a loopback registry, beside skopeo copy and oras-py, same files."""
    from support.oci_registry import LocalRegistry

    from registry.cache import pull_local
    from registry.convert.execute import convert
    from registry.store.local import LocalStore

    bin_dir = Path(sys.executable).parent
    mreg = bin_dir / "mreg"
    total = int(gb * 1e9)
    src = random_model(work / "src-oci", total)
    store = LocalStore(work / "store-oci")
    version = convert(store, pull_local(work / "cache-oci", src), "big", [("hf", {})]).version
    nbytes = sum(f.size for a in version.manifest.artifacts for f in a.files)
    env = {**os.environ, "MREG_STORE": str(store.root), "MREG_CACHE_DIR": str(work / "cache-oci")}
    tool_home = work / "tool-home"
    tool_home.mkdir()
    tool_env = {**os.environ, "HOME": str(tool_home), "XDG_DATA_HOME": str(tool_home / "share")}
    out: dict[str, Any] = {"bytes": nbytes, "files": sorted(p.name for p in src.iterdir())}
    with LocalRegistry(work / "registry-oci") as reg:
        host = reg.host
        push = measured([mreg, "push", "big@1", f"oci://{host}/bench/mreg:v1", "--insecure", "--json"], env=env)
        repush = measured([mreg, "push", "big@1", f"oci://{host}/bench/mreg:v1", "--insecure", "--json"], env=env)
        pull = measured([mreg, "pull", f"oci://{host}/bench/mreg:v1", "--insecure", "--cache-dir",
                         work / "pull-cache-oci", "--json"], env=env)
        pushed, again = json.loads(push["stdout"]), json.loads(repush["stdout"])
        out["mreg_push"] = {**_figure(push, nbytes), "uploaded_bytes": pushed["uploaded_bytes"]}
        out["mreg_repush"] = {**_figure(repush, nbytes), "uploaded_bytes": again["uploaded_bytes"],
                              "reused": again["reused"]}
        out["mreg_pull"] = {**_figure(pull, nbytes), "files": json.loads(pull["stdout"])["files"]}
        print(f"oci mreg: {out['mreg_push']} {out['mreg_repush']} {out['mreg_pull']}", flush=True)

        layout = work / "layout-oci"
        measured([mreg, "push", "big@1", f"oci-layout:{layout}:v1", "--json"], env=env)
        sk_push = measured(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:v1",
                            f"docker://{host}/bench/skopeo:v1"], env=tool_env)
        sk_pull = measured(["skopeo", "copy", "--src-tls-verify=false", f"docker://{host}/bench/skopeo:v1",
                            f"oci:{work / 'skopeo-down'}:v1"], env=tool_env)
        out["skopeo_copy_push"] = _figure(sk_push, nbytes)
        out["skopeo_copy_pull"] = _figure(sk_pull, nbytes)
        print(f"oci skopeo: {out['skopeo_copy_push']} {out['skopeo_copy_pull']}", flush=True)

        files = sorted(p.name for p in src.iterdir())
        for label, chunked in (("oras_py", "0"), ("oras_py_chunked", "1")):
            target = f"{host}/bench/{label.replace('_', '-')}:v1"
            o_push = measured([sys.executable, "-c", _ORAS, "push", host, target, chunked, *files], env=tool_env,
                              cwd=src)
            o_pull = measured([sys.executable, "-c", _ORAS, "pull", host, target, chunked,
                               work / f"{label}-down"], env=tool_env)
            out[f"{label}_push"] = _figure(o_push, nbytes)
            out[f"{label}_pull"] = _figure(o_pull, nbytes)
            print(f"oci {label}: {out[f'{label}_push']} {out[f'{label}_pull']}", flush=True)
    out["note"] = ("mreg pull hashes every layer against its digest; skopeo copy verifies digests too; oras-py's "
                   "pull writes what it receives without checking a digest, and its default push reads each file "
                   "into memory for one PUT")
    results[f"oci_{gb:g}GB"] = out
    for d in ("src-oci", "store-oci", "cache-oci", "pull-cache-oci", "registry-oci", "layout-oci", "skopeo-down",
              "oras_py-down", "oras_py_chunked-down", "tool-home"):
        subprocess.run(["chmod", "-R", "u+w", str(work / d)], check=False, capture_output=True)
        shutil.rmtree(work / d, ignore_errors=True)
