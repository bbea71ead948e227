"""The web view without a browser: the server's refusals and headers, the JSON twins against `--json`, escaping,
damaged items, the static site, and the models page of a 1,000-version store under a second."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok, run
from support.web_store import PAYLOAD, WebStore, copy_versions

from registry import api, layout
from registry.store.local import LocalStore
from registry.web import documents, pages
from registry.web.server import UIServer
from registry.web.site import MARKER, build


def get(server: UIServer, path: str, method: str = "GET", host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request to the live server: status, headers, body."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.putrequest(method, path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_read_only_loopback_and_strict_headers(live: UIServer) -> None:
    assert live.server_address[0] == "127.0.0.1" and live.loopback
    status, headers, body = get(live, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"].startswith("default-src 'none'; style-src 'sha256-")
    assert "script-src" not in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    assert b"<script" not in body and pages.META_CSP.encode() in body.replace(b"&#39;", b"'")
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "BREW"):
        status, headers, _ = get(live, "/", method)
        assert (status, headers["allow"]) == (405, "GET, HEAD"), method
    status, headers, body = get(live, "/models/alpha/", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    assert get(live, "/", host="evil.example:8080")[0] == 421  # DNS rebinding: another name for this address


@pytest.mark.parametrize("path", ["/blobs/sha256/", "/models/alpha/versions/1/hf/model.safetensors",
                                  "/models/alpha/versions/1/manifest.json", "/../../etc/passwd", "/%2e%2e/etc/passwd",
                                  "/models/alpha/history.jsonl", "/models/..%2f..%2fetc/index.html"])
def test_no_store_file_is_ever_served(live: UIServer, path: str) -> None:
    status, _, body = get(live, path)
    assert status in (301, 400, 404), (path, status)
    assert b"safetensors" not in body[:8] and b"root:" not in body


def test_json_twins_are_the_cli_documents(web_store: WebStore, live: UIServer) -> None:
    history = web_store.cli("history", "alpha")
    model = json.loads(get(live, "/models/alpha/index.json")[2])
    assert model["history"] == history["entries"] and model["aliases"] == {"production": 2, "staging": 3}
    assert json.loads(get(live, "/models/alpha/?format=json")[2]) == model
    show = web_store.cli("show", "alpha@2", "--memory", "80")
    version = json.loads(get(live, "/models/alpha/versions/2/index.json")[2])
    assert {k: version[k] for k in show if k != "serving"} == {k: v for k, v in show.items() if k != "serving"}
    assert version.get("serving") == show.get("serving")
    listing = web_store.cli("list", "alpha")["versions"]  # (`mreg list` of the whole store stops at `broken`)
    rows = model["versions"]
    assert [(r["version"], r["formats"], r["bytes"], r["manifest_sha256"]) for r in listing] == [
        (r["version"], [f["format"] for f in r["formats"]], r["bytes"], r["manifest_sha256"]) for r in rows]
    models = json.loads(get(live, "/index.json")[2])
    assert models["models"][0] == {**models["models"][0], "name": "alpha", "versions": 3, "latest": 3,
                                   "aliases": {"production": 2, "staging": 3}, "last_change": history["entries"][-1]}


def test_as_of_matches_history_at(web_store: WebStore, live: UIServer) -> None:
    second = web_store.history[1]["by"]["at"]  # type: ignore[index]
    cli = web_store.cli("history", "alpha", "--at", second)
    page = json.loads(get(live, f"/models/alpha/index.json?at={second.replace('+', '%2B')}")[2])
    assert {"schema_version": 1, **page["as_of"]} == cli and cli["aliases"]["production"]["version"] == 2
    assert "staging" not in cli["aliases"]
    before = web_store.cli("history", "alpha", "--at", "2000-01-01")
    assert before["aliases"] == {}
    status, _, body = get(live, "/models/alpha/?at=nonsense")
    assert status == 400 and b"not a time" in body
    r = run("history", "alpha", "--at", "yesterday", "--store", str(web_store.store), "--json")
    assert r.exit_code == 2 and "not a time" in r.json["error"]["message"]


def test_store_strings_are_escaped(live: UIServer) -> None:
    body = get(live, "/models/alpha/")[2].decode()
    assert PAYLOAD not in body and "&lt;img src=x onerror=alert(1)&gt;" in body


def test_damaged_items_are_marked_not_fatal(live: UIServer) -> None:
    status, _, body = get(live, "/")
    assert status == 200 and b'data-model="gamma"' in body
    models = {m["name"]: m for m in json.loads(get(live, "/index.json")[2])["models"]}
    assert models["gamma"]["problems"] == []
    broken = {p["item"]: p for p in models["broken"]["problems"]}
    assert set(broken) == {"aliases", "history"} and broken["aliases"]["type"] == "IntegrityError"
    model = json.loads(get(live, "/models/broken/index.json")[2])
    rows = {r["version"]: r for r in model["versions"]}
    assert rows[2]["problems"][0]["type"] == "IntegrityError" and "does not parse" in rows[2]["problems"][0]["message"]
    assert rows[1]["problems"] == [] and rows[3]["problems"] == []
    status, _, body = get(live, "/models/broken/versions/2/")
    assert status == 500 and b"does not parse" in body
    assert get(live, "/models/broken/versions/3/")[0] == 200
    assert get(live, "/models/nothing/")[0] == 404 and get(live, "/models/alpha/versions/99/")[0] == 404


def test_compare_shows_changed_added_files(live: UIServer) -> None:
    doc = json.loads(get(live, "/models/alpha/compare/1-3/index.json")[2])
    files = doc["files"]
    assert [f["path"] for f in files["added"]] == ["hf/NOTICE.md"]
    assert "hf/model.safetensors" in {f["path"] for f in files["changed"]} and files["same"] >= 1
    assert doc["a"]["bytes"] < doc["b"]["bytes"]
    status, headers, _ = get(live, "/models/alpha/compare/index.html?a=1&b=3")
    assert status == 303 and headers["location"] == "1-3/index.html"


def test_static_site(web_store: WebStore, tmp_path: Path) -> None:
    out = tmp_path / "site"
    made = ok(run("site", "build", out, "--store", web_store.store, "--json"))
    assert made["pages"] == 1 + 4 + (3 + 4 + 4 + 3) + (2 + 3 + 3 + 2) and (out / MARKER).is_file()
    index = (out / "index.html").read_text()
    assert 'href="models/alpha/index.html"' in index and "<script" not in index
    assert "Content-Security-Policy" in index
    model = (out / "models/alpha/index.html").read_text()
    assert 'href="versions/2/index.html"' in model and 'href="../../index.html"' in model
    assert "&lt;img src=x" in model and 'id="asof-form"' not in model  # no server to ask: no form
    assert json.loads((out / "models/alpha/index.json").read_text())["history"] == web_store.history
    assert "does not parse" in (out / "models/broken/versions/2/index.html").read_text()
    again = ok(run("site", "build", out, "--store", web_store.store, "--json"))  # a site mreg built is replaced
    assert again["files"] == made["files"]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    r = run("site", "build", other, "--store", web_store.store, "--json")
    assert r.exit_code == 2 and (other / "notes.txt").read_text() == "keep"


@pytest.mark.slow
def test_a_thousand_versions(tmp_path: Path, web_store: WebStore, capsys: pytest.CaptureFixture[str]) -> None:
    """50 models of 20 versions: the models page in under a second; each page and the site build timed."""
    store = LocalStore(tmp_path / "big")
    seed = layout.version_dir(web_store.store, "alpha", 1)
    big_base = layout.version_dir(store.root, "seed", 1)
    big_base.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(seed, big_base, copy_function=shutil.copy2)
    copy_versions(store, big_base, [f"model-{i:02d}" for i in range(50)], 20)
    shutil.rmtree(layout.model_dir(store.root, "seed"), ignore_errors=True)
    settings = api.settings(store=str(store.root))

    def render(path: str) -> tuple[float, Any]:
        started = time.perf_counter()
        r = pages.Site(documents.Reader(store, lambda n: api.trust_policy(settings, n)), live=True).respond(path, {})
        assert r.status == 200, r.body[:300]
        return time.perf_counter() - started, r

    timings = {p: min(render(p)[0] for _ in range(3)) for p in
               ("index.html", "models/model-07/index.html", "models/model-07/versions/12/index.html",
                "models/model-07/compare/11-12/index.html")}
    assert timings["index.html"] < 1.0, timings
    assert json.loads(render("index.json")[1].body)["models"][7]["versions"] == 20
    started = time.perf_counter()
    made = build(documents.Reader(store, lambda n: api.trust_policy(settings, n)), tmp_path / "site")
    timings["site build"] = time.perf_counter() - started
    assert made.pages == 1 + 50 * (1 + 20 + 19)
    with capsys.disabled():
        print("\nweb view, 1,000 versions:", ", ".join(f"{p} {t * 1000:.0f} ms" for p, t in timings.items()))


def test_mreg_ui_command(web_store: WebStore) -> None:
    """`mreg ui --port 0 --json` in its own process: where it listens (loopback), then pages until stopped."""
    proc = subprocess.Popen([sys.executable, "-c", "from registry.cli import run; run()", "ui", "--store",
                             str(web_store.store), "--port", "0", "--json", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        assert doc["url"].startswith("http://127.0.0.1:") and doc["store"] == str(web_store.store)
        with urllib.request.urlopen(doc["url"] + "models/alpha/index.json", timeout=30) as r:
            assert json.loads(r.read())["aliases"] == {"production": 2, "staging": 3}
    finally:
        proc.terminate()
        proc.wait(10)


def test_pictures_escape_what_they_draw() -> None:
    """The SVG timeline and the gguf:auto trade-off: every store string escaped, no script, no style attribute."""
    from registry.web import svg

    by = {"user": "<script>x</script>", "host": "h", "at": "2026-01-02T00:00:00+00:00"}
    line = str(svg.timeline([{"alias": "production", "action": "promote", "from": None, "to": 1, "reason": PAYLOAD,
                              "by": by}, {"alias": "production", "action": "rollback", "from": 1, "to": 2,
                                          "reason": None, "by": {**by, "at": "2026-01-03T00:00:00+00:00"}}]))
    chart = str(svg.tradeoff({"chosen": "Q4_K_M", "budget": {"kl_divergence": 0.1}, "candidates": [
        {"type": "Q4_K_M", "tensor_bytes": 10, "file_bytes": 12, "meets": True, "metrics": {"kl_divergence": 0.05}},
        {"type": "<b>Q2_K</b>", "tensor_bytes": 5, "meets": False, "metrics": {"kl_divergence": 0.3}}]}))
    for picture in (line, chart):
        assert picture.startswith("<svg") and "<script" not in picture and "<img" not in picture
        assert "style=" not in picture and "<b>" not in picture
    assert "&lt;img src=x onerror=alert(1)&gt;" in line and line.count("<circle") == 2
    assert "&lt;b&gt;Q2_K&lt;/b&gt;" in chart and 'stroke-width="2"' in chart  # the chosen one ringed


@pytest.mark.slow
def test_an_s3_store(web_store: WebStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same pages from an S3 store (SeaweedFS on loopback): aliases, history, versions, a comparison."""
    from support.s3_server import running

    with running(tmp_path / "seaweed", "mreg-web") as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        remote = "s3://mreg-web/store"
        for n in (1, 2):
            ok(run("push", f"alpha@{n}", remote, "--store", web_store.store, "--json"))
        ok(run("promote", "alpha@1", "--store", remote, "-m", PAYLOAD, "--json"))
        ok(run("promote", "alpha@2", "--store", remote, "--json"))
        site = pages.Site(documents.Reader(api.open_store(remote), lambda n: api.trust_policy(api.settings(), n)),
                          live=True)
        models = json.loads(site.respond("index.json", {}).body)["models"]
        assert [(m["name"], m["versions"], m["aliases"]) for m in models] == [("alpha", 2, {"production": 2})]
        model = site.respond("models/alpha/index.html", {})
        assert model.status == 200 and b"&lt;img src=x onerror=alert(1)&gt;" in model.body
        assert site.respond("models/alpha/versions/2/index.html", {}).status == 200
        compare = json.loads(site.respond("models/alpha/compare/1-2/index.json", {}).body)
        assert "hf/model.safetensors" in {f["path"] for f in compare["files"]["changed"]}


@pytest.mark.slow
def test_a_rollout_in_progress_is_shown_with_its_weight(mreg: Any, model_dir: Path, tmp_path: Path) -> None:
    for i in range(2):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "r", "--json"))
    ok(mreg("promote", "r@1", "--json"))
    ok(mreg("rollout", "start", "r@2", "--steps", "5,25,100", "--json"))
    ok(mreg("rollout", "advance", "r", "--json"))
    out = tmp_path / "site"
    ok(mreg("site", "build", out, "--json"))
    (row,) = json.loads((out / "index.json").read_text())["models"]
    (shown,) = row["rollouts"]
    assert {k: shown[k] for k in ("alias", "stable", "canary", "weight", "state", "steps", "step")} == {
        "alias": "production", "stable": 1, "canary": 2, "weight": 5, "state": "running", "steps": [5, 25, 100],
        "step": 0}
    assert "rollout: " in (out / "index.html").read_text() and "at 5% (running)" in (out / "index.html").read_text()
    model = (out / "models/r/index.html").read_text()
    assert 'aria-label="rollout progress"' in model and "canary at 5%" in model
    assert json.loads((out / "models/r/index.json").read_text())["rollouts"] == row["rollouts"]
    ok(mreg("rollout", "abort", "r", "--json"))
    ok(mreg("site", "build", out, "--json"))
    assert json.loads((out / "index.json").read_text())["models"][0]["rollouts"] == []
