"""Alias-change events: CloudEvents 1.0 JSON POSTs to the config file's URLs for promote, rollback and every
rollout step, signed with HMAC when a secret is set, retried, and never able to block or undo the change."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok


class Sink:
    """A loopback HTTP server that keeps every event POSTed to it; the first POST of each event answers 500."""

    def __init__(self) -> None:
        self.events: list[tuple[dict[str, str], bytes]] = []
        self.refused: set[str] = set()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                event_id = json.loads(body)["id"]
                if event_id not in sink.refused:  # a retry must come
                    sink.refused.add(event_id)
                    self.send_response(500)
                else:
                    sink.events.append((dict(self.headers), body))
                    self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.server.shutdown()


@pytest.mark.slow
def test_every_alias_change_is_an_event(mreg: Any, model_dir: Path, tmp_path: Path, sink: Sink) -> None:
    config = tmp_path / "mreg.toml"
    config.write_text(f'[events]\nurls = ["{sink.url}"]\nsecret = "s3cret"\ntries = 3\n')
    cfg = ["--config", str(config)]
    for i in range(2):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    ok(mreg("promote", "m@1", "-m", "first", *cfg, "--json"))
    ok(mreg("rollout", "start", "m@2", "--steps", "50,100", *cfg, "--json"))
    ok(mreg("rollout", "run", "m", *cfg, "--json"))
    ok(mreg("rollback", "m", *cfg, "--json"))
    docs = []
    for headers, body in sink.events:
        assert headers["Content-Type"].startswith("application/cloudevents+json")
        expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert headers["X-Mreg-Signature"] == f"sha256={expected}"
        docs.append(json.loads(body))
    docs.sort(key=lambda d: d["time"])  # each delivery runs in its own thread: they may arrive out of order
    assert [(d["data"]["action"], d["data"]["from"], d["data"]["to"], d["data"]["weight"]) for d in docs] == [
        ("promote", None, 1, None), ("rollout-start", 1, 1, 0), ("rollout-step", 1, 1, 50),
        ("rollout-done", 1, 2, 100), ("rollback", 2, 1, None)]
    first = docs[0]
    assert first["specversion"] == "1.0" and first["type"] == "dev.mreg.alias.changed"
    assert first["subject"] == "m/production" and first["source"].startswith("mreg:")
    assert first["data"]["why"] == "first" and "@" in first["data"]["who"] and first["time"].endswith("Z")
    assert len({d["id"] for d in docs}) == len(docs) == len(sink.refused), "each event retried once, then delivered"


def test_failed_delivery_never_blocks_the_change(mreg: Any, model_dir: Path, tmp_path: Path,
                                                 store_root: Path) -> None:
    config = tmp_path / "mreg.toml"
    config.write_text('[events]\nurls = ["http://127.0.0.1:9/events"]\ntries = 2\n')
    assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    r = mreg("promote", "m@1", "--config", str(config), "--json")
    assert r.exit_code == 0 and r.json["to"] == 1
    assert (store_root / "models/m/production").is_symlink()
    assert "warning: alias-change event not delivered to http://127.0.0.1:9/events after 2 tries" in r.stderr
    kept = store_root / "events/undelivered.jsonl"
    assert f"kept in {kept}" in r.stderr
    (line,) = kept.read_text().splitlines()
    record = json.loads(line)
    assert record["url"] == "http://127.0.0.1:9/events" and record["tries"] == 2
    assert record["event"]["data"]["action"] == "promote" and record["event"]["type"] == "dev.mreg.alias.changed"


@pytest.mark.parametrize(("table", "needle"), [
    ('urls = "http://x"', "list of URLs"),
    ('urls = ["ftp://x/y"]', "scheme"),
    ('urls = ["http://x"]\ntries = 0', "tries"),
    ('urls = ["http://x"]\nsecret = ""', "secret"),
    ('hooks = ["http://x"]', "unknown keys"),
])
def test_bad_events_settings_are_usage_errors(mreg: Any, model_dir: Path, tmp_path: Path, table: str,
                                              needle: str) -> None:
    config = tmp_path / "mreg.toml"
    config.write_text(f"[events]\n{table}\n")
    assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    r = mreg("promote", "m@1", "--config", str(config), "--json")
    assert r.exit_code == 2 and needle in r.json["error"]["message"], r.json
    assert r.json["error"]["hint"]
