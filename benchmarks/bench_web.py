"""The web view on a large store: 50 models of 20 versions (1,000 versions), one tiny real conversion copied.

Measures each page rendered in-process (median of 5, a fresh reader each time, as the server does per request),
the same pages fetched over HTTP from `mreg ui` in its own process, that process's resident memory (VmRSS, after
the requests), and `mreg site build` of the whole store. Prints one JSON document.

    python benchmarks/bench_web.py [--models 50] [--versions 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

#: `mreg` in a process of its own, from this checkout (PYTHONPATH) or the installed package.
MREG = [sys.executable, "-c", "from registry.cli import run; run()"]
PAGES = ["index.html", "models/model-07/index.html", "models/model-07/versions/12/index.html",
         "models/model-07/compare/11-12/index.html", "index.json"]


def make_store(root: Path, models: int, versions: int) -> Path:
    """One real conversion of a tiny llama, copied into `models` × `versions` versions."""
    os.environ.update({"HOME": str(root / "home"), "MREG_STORE": str(root / "store"),
                       "MREG_CACHE_DIR": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "home/.config")})
    from support.cli import ok, run
    from support.tiny_models import build_tiny_llama
    from support.web_store import copy_versions

    from registry import layout
    from registry.store.local import LocalStore

    ok(run("convert", build_tiny_llama(root / "src"), "--to", "hf", "--name", "seed", "--json"))
    store = LocalStore(root / "store")
    copy_versions(store, layout.version_dir(store.root, "seed", 1), [f"model-{i:02d}" for i in range(models)], versions)
    return store.root


def in_process(store_root: Path) -> dict[str, float]:
    from registry import api
    from registry.web import documents, pages

    store, settings = api.open_store(store_root), api.settings(store=str(store_root))
    out = {}
    for path in PAGES:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            r = pages.Site(documents.Reader(store, lambda n: api.trust_policy(settings, n)), live=True).respond(path,
                                                                                                                {})
            times.append(time.perf_counter() - started)
            assert r.status == 200, path
        out[path] = round(statistics.median(times) * 1000, 1)
    return out


def over_http(store_root: Path) -> tuple[dict[str, float], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*MREG, "ui", "--store", str(store_root), "--port",
                             str(port), "--quiet"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        proc.stderr.readline()  # "mreg ui: http://..." once it listens
        out = {}
        for path in PAGES:
            times = []
            for _ in range(5):
                started = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=30) as r:
                    r.read()
                times.append(time.perf_counter() - started)
            out[path] = round(statistics.median(times) * 1000, 1)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return out, rss
    finally:
        proc.terminate()
        proc.wait(10)


def site_build(store_root: Path, out: Path) -> dict[str, object]:
    started = time.perf_counter()
    done = subprocess.run([*MREG, "site", "build", str(out), "--store",
                           str(store_root), "--json"], capture_output=True, text=True, check=True)
    return {"wall_s": round(time.perf_counter() - started, 2), **json.loads(done.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="mreg-web-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    store = make_store(root, args.models, args.versions)
    built = time.perf_counter() - started
    http, rss = over_http(store)
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "models": args.models, "versions": args.models * args.versions,
        "store_made_s": round(built, 2), "render_ms": in_process(store), "http_ms": http, "server_rss_kib": rss,
        "site_build": site_build(store, root / "site"),
    }, indent=1))


if __name__ == "__main__":
    main()
