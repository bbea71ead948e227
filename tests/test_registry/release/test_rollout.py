"""Staged rollouts on a local store: steps, gates, apply, abort, pause, the guard on promote/rollback, a killed
`run` resumed, a crash between a step's commit and its apply repaired."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok

from registry import layout


@pytest.fixture
def three(mreg: Any, model_dir: Path) -> str:
    """Model `m` with versions 1, 2, 3; production -> 1."""
    for i in range(3):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    ok(mreg("promote", "m@1", "--json"))
    return "m"


def _apply_cmd(log: Path) -> str:
    """An apply command that logs its environment and standard input, one JSON line per call."""
    script = log.parent / "apply.py"
    script.write_text(
        "import json, os, sys\n"
        "doc = {k: v for k, v in os.environ.items() if k.startswith('MREG_')}\n"
        "doc['stdin'] = json.loads(sys.stdin.read())\n"
        f"open({str(log)!r}, 'a').write(json.dumps(doc) + '\\n')\n")
    return f"{sys.executable} {script}"


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_rollout_steps_to_done(mreg: Any, three: str, store_root: Path, tmp_path: Path) -> None:
    log = tmp_path / "apply.log"
    doc = ok(mreg("rollout", "start", "m@2", "--steps", "10,50,100", "--apply", _apply_cmd(log), "-m", "try 2",
                  "--json"))
    assert doc["rollout"]["state"] == "running" and doc["rollout"]["weight"] == 0 and doc["rollout"]["applied"]
    mdir = store_root / "models/m"
    assert os.readlink(mdir / "production") == "versions/1", "the stable alias is not touched"
    assert os.readlink(mdir / "production-canary") == "versions/2"
    assert ok(mreg("resolve", "m@production-canary", "--json"))["version"] == 2
    first = ok(mreg("rollout", "advance", "m", "--json"))["rollout"]
    assert (first["step"], first["weight"], first["state"]) == (0, 10, "running")
    run = ok(mreg("rollout", "run", "m", "--json"))
    assert run["rollout"]["state"] == "done" and [s["weight"] for s in run["steps_taken"]] == [50, 100]
    assert os.readlink(mdir / "production") == "versions/2"
    assert not os.path.lexists(mdir / "production-canary"), "the canary alias goes with the last step"
    calls = _calls(log)
    assert [c["MREG_CANARY_WEIGHT"] for c in calls] == ["0", "10", "50", "100"]
    last = calls[-1]
    assert last["MREG_STABLE_VERSION"] == "1" and last["MREG_CANARY_VERSION"] == "2"
    assert last["MREG_STABLE_PATH"] == str(mdir / "production")
    assert last["MREG_CANARY_PATH"] == str(mdir / "production-canary")
    assert last["stdin"]["canary"] == {"version": 2, "alias": "production-canary", "weight": 100,
                                       "path": str(mdir / "production-canary")}
    hist = ok(mreg("history", "m", "--alias", "production", "--json"))["entries"]
    assert [(e["action"], e["from"], e["to"], (e.get("rollout") or {}).get("weight")) for e in hist] == [
        ("promote", None, 1, None), ("rollout-start", 1, 1, 0), ("rollout-step", 1, 1, 10),
        ("rollout-step", 1, 1, 50), ("rollout-done", 1, 2, 100)]
    assert hist[1]["reason"] == "try 2" and hist[2]["by"]["user"]
    assert "canary 2 at 50%" in mreg("history", "m").stdout
    again = ok(mreg("rollout", "run", "m", "--json"))
    assert again["changed"] is False and again["rollout"]["state"] == "done", "a finished rollout: nothing to do"
    assert ok(mreg("rollback", "m", "--json"))["to"] == 1, "rollback after a rollout goes to the old stable"


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--steps", "50,25,100"], 2, "rise strictly"),
    (["--steps", "5,25,90"], 2, "rise strictly"),
    (["--steps", "0,100"], 2, "rise strictly"),
    (["--steps", "five"], 2, "whole percentages"),
    (["--steps", "5,100", "--gate", "dns:x"], 2, "unknown gate kind"),
    (["--steps", "5,100", "--gate", "prom:http://127.0.0.1:9|up"], 2, "no bound"),
    (["--steps", "5,100", "--gate", "prom:http://127.0.0.1:9|up|~5"], 2, "no bound"),
    (["--steps", "5,100", "--gate", "prom:http://127.0.0.1:9|sum(up|<1"], 2, "brackets"),
    (["--steps", "5,100", "--gate", "prom:http://127.0.0.1:9|up|<1|for=forever"], 2, "not a duration"),
    (["--steps", "5,100", "--gate", "http:ftp://x/y"], 2, "scheme"),
    (["--steps", "5,100", "--gate", "http:http://"], 2, "names no host"),
    (["--steps", "5,100", "--interval", "soon"], 2, "not a duration"),
    (["--steps", "5,100", "--apply", ""], 2, "shell command"),
    (["--steps", "5,100", "--expect", "3"], 5, "not 3 as expected"),
])
def test_bad_start_changes_nothing(mreg: Any, three: str, store_root: Path, args: list[str], code: int,
                                   needle: str) -> None:
    before = (store_root / "models/m/history.jsonl").read_bytes()
    r = mreg("rollout", "start", "m@2", *args, "--json")
    assert r.exit_code == code, r.stdout + r.stderr
    assert needle in r.json["error"]["message"], r.json
    assert (store_root / "models/m/history.jsonl").read_bytes() == before
    assert not os.path.lexists(store_root / "models/m/production-canary")
    assert not (store_root / "models/m/rollouts").exists()


def test_start_refusals(mreg: Any, three: str, store_root: Path) -> None:
    r = mreg("rollout", "start", "m@1", "--steps", "5,100", "--json")
    assert r.exit_code == 2 and "already the stable version" in r.json["error"]["message"]
    r = mreg("rollout", "start", "m@2", "--alias", "staging", "--steps", "5,100", "--json")
    assert r.exit_code == 3 and "no alias staging" in r.json["error"]["message"]
    ok(mreg("rollout", "start", "m@2", "--steps", "5,100", "--json"))
    r = mreg("rollout", "start", "m@3", "--steps", "5,100", "--json")
    assert r.exit_code == 5 and "already under a rollout of 2" in r.json["error"]["message"]
    assert os.readlink(store_root / "models/m/production-canary") == "versions/2"


def test_failed_verification_is_a_gate_error(mreg: Any, three: str, store_root: Path) -> None:
    mpath = store_root / "models/m/versions/3/manifest.json"
    doc = json.loads(mpath.read_text())
    doc["artifacts"][0]["verification"]["status"] = "failed"
    os.chmod(mpath, 0o644)
    mpath.write_text(json.dumps(doc, indent=2) + "\n")
    r = mreg("rollout", "start", "m@3", "--steps", "5,100", "--json")
    assert r.exit_code == 6 and "failed verification" in r.json["error"]["message"]
    assert not (store_root / "models/m/rollouts").exists()


def test_promote_and_rollback_refused_under_rollout(mreg: Any, three: str, store_root: Path) -> None:
    ok(mreg("rollout", "start", "m@2", "--steps", "5,100", "--json"))
    r = mreg("promote", "m@3", "--json")
    assert r.exit_code == 5 and "under a staged rollout" in r.json["error"]["message"]
    r = mreg("rollback", "m", "--to", "1", "--json")
    assert r.exit_code == 5 and "--force" in r.json["error"]["hint"]
    assert ok(mreg("promote", "m@3", "--force", "--json"))["to"] == 3
    assert ok(mreg("rollout", "status", "m", "--json"))["rollout"]["state"] == "aborted"
    assert not os.path.lexists(store_root / "models/m/production-canary")
    actions = [e["action"] for e in ok(mreg("history", "m", "--json"))["entries"]]
    assert actions[-2:] == ["rollout-abort", "promote"]


def test_pause_resume_abort(mreg: Any, three: str, store_root: Path) -> None:
    ok(mreg("rollout", "start", "m@2", "--steps", "5,50,100", "--json"))
    ok(mreg("rollout", "advance", "m", "--json"))
    assert ok(mreg("rollout", "pause", "m", "-m", "look", "--json"))["rollout"]["state"] == "paused"
    r = mreg("rollout", "advance", "m", "--json")
    assert r.exit_code == 5 and "paused" in r.json["error"]["message"]
    assert ok(mreg("rollout", "resume", "m", "--json"))["rollout"]["state"] == "running"
    doc = ok(mreg("rollout", "abort", "m", "-m", "enough", "--json"))["rollout"]
    assert (doc["state"], doc["weight"]) == ("aborted", 0)
    assert os.readlink(store_root / "models/m/production") == "versions/1"
    assert not os.path.lexists(store_root / "models/m/production-canary")
    r = mreg("rollout", "abort", "m", "--json")
    assert r.exit_code == 3 and "no rollout running" in r.json["error"]["message"]
    hist = ok(mreg("history", "m", "--json"))["entries"]
    assert [e["action"] for e in hist][-4:] == ["rollout-step", "rollout-pause", "rollout-resume", "rollout-abort"]
    assert hist[-1]["reason"] == "enough"
    ok(mreg("rollout", "start", "m@3", "--steps", "100", "--json")), "an ended rollout makes room for the next"


@pytest.mark.slow
def test_failing_http_gate_aborts_with_exit_10(mreg: Any, three: str, store_root: Path, tmp_path: Path) -> None:
    log = tmp_path / "apply.log"
    ok(mreg("rollout", "start", "m@2", "--steps", "5,100", "--gate", "http:http://127.0.0.1:9/health",
            "--apply", _apply_cmd(log), "--json"))
    t0 = time.monotonic()
    r = mreg("rollout", "run", "m", "--json")
    assert r.exit_code == 10, r.stdout + r.stderr
    assert time.monotonic() - t0 < 15, "an unreachable gate fails after a bounded number of tries"
    assert r.json["rollout"]["state"] == "aborted" and r.json["error"]["type"] == "RolloutAborted"
    assert "http:http://127.0.0.1:9/health failed" in r.json["error"]["message"]
    assert r.json["gates"][0]["passed"] is False
    assert [c["MREG_CANARY_WEIGHT"] for c in _calls(log)] == ["0", "0"]
    hist = ok(mreg("history", "m", "--json"))["entries"]
    assert hist[-1]["action"] == "rollout-abort" and "automatic abort" in hist[-1]["reason"]
    assert hist[-1]["rollout"]["gates"][0]["passed"] is False
    assert os.readlink(store_root / "models/m/production") == "versions/1"


@pytest.mark.slow
def test_unreachable_prometheus_fails_never_passes(mreg: Any, three: str) -> None:
    ok(mreg("rollout", "start", "m@2", "--steps", "5,50,100",
            "--gate", 'prom:http://127.0.0.1:9|sum(rate(x{a=~"b|c"}[1m]))|<0.05|for=1s', "--json"))
    ok(mreg("rollout", "advance", "m", "--json")), "no prom gate is asked before the canary has traffic"
    r = mreg("rollout", "advance", "m", "--json")
    assert r.exit_code == 10 and "no answer from Prometheus" in r.json["error"]["message"], r.json
    assert "after 3 tries" in r.json["gates"][0]["detail"]


def test_failed_apply_aborts(mreg: Any, three: str, store_root: Path) -> None:
    ok(mreg("rollout", "start", "m@2", "--steps", "5,100", "--apply",
            'test "$MREG_CANARY_WEIGHT" = 0 || { echo router said no; exit 3; }', "--json"))
    r = mreg("rollout", "advance", "m", "--json")
    assert r.exit_code == 10 and "apply exited 3 for weight 5: router said no" in r.json["error"]["message"]
    assert r.json["rollout"]["state"] == "aborted" and r.json["rollout"]["applied"] is True
    assert not os.path.lexists(store_root / "models/m/production-canary")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "from registry.cli import run; run()", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_killed_run_resumes_from_the_recorded_step(mreg: Any, three: str, store_root: Path, tmp_path: Path) -> None:
    log = tmp_path / "apply.log"
    # The interval is the window in which this test must see step 20 and kill the run before it takes the next
    # one: 3 s, wide enough for a loaded machine's status reads.
    ok(mreg("rollout", "start", "m@2", "--steps", "10,20,100", "--interval", "3s", "--apply", _apply_cmd(log),
            "--json"))
    ok(mreg("rollout", "advance", "m", "--json"))
    proc = _cli("rollout", "run", "m", "--json")
    deadline = time.monotonic() + 30
    while ok(mreg("rollout", "status", "m", "--json"))["rollout"]["weight"] != 20:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert ok(mreg("rollout", "status", "m", "--json"))["rollout"]["state"] == "running"
    done = ok(mreg("rollout", "run", "m", "--json"))
    assert done["rollout"]["state"] == "done" and [s["weight"] for s in done["steps_taken"]] == [100]
    weights = [c["MREG_CANARY_WEIGHT"] for c in _calls(log)]
    assert weights[:3] == ["0", "10", "20"] and weights[-1] == "100" and set(weights) <= {"0", "10", "20", "100"}


def test_crash_between_commit_and_apply_is_repaired(mreg: Any, three: str, store_root: Path, tmp_path: Path) -> None:
    """The apply kills mreg (SIGKILL) once, after the weight is recorded: the next command runs it again."""
    marker, log = tmp_path / "crashed", tmp_path / "applied"
    cmd = (f'if [ "$MREG_CANARY_WEIGHT" = 30 ] && [ ! -e {marker} ]; then touch {marker}; kill -9 $PPID; sleep 5; '
           f'fi; echo "$MREG_CANARY_WEIGHT" >> {log}')
    ok(mreg("rollout", "start", "m@2", "--steps", "30,100", "--apply", cmd, "--json"))
    proc = _cli("rollout", "advance", "m")
    proc.wait(timeout=30)
    assert proc.returncode == -9
    rec = json.loads((store_root / "models/m/rollouts/production.json").read_text())
    assert (rec["weight"], rec["applied"]) == (30, False), "the weight is the commit; the apply did not finish"
    assert log.read_text().split() == ["0"]
    doc = ok(mreg("rollout", "run", "m", "--json"))
    assert doc["rollout"]["state"] == "done"
    assert log.read_text().split() == ["0", "30", "100"], "the recorded weight was applied again, then the rest"


def test_second_start_races(mreg: Any, three: str, store_root: Path) -> None:
    procs = [_cli("rollout", "start", f"m@{v}", "--steps", "5,100", "--json") for v in (2, 3)]
    codes = sorted(p.wait(timeout=60) for p in procs)
    assert codes == [0, 5], [p.stderr.read() if p.stderr else b"" for p in procs]
    rec = json.loads((store_root / "models/m/rollouts/production.json").read_text())
    assert os.readlink(store_root / "models/m" / layout.canary_alias("production")) == f"versions/{rec['canary']}"


def test_python_api(three: str, store_root: Path) -> None:
    from registry import api
    from registry.release.probes import Probing
    from registry.release.rollout import RolloutAborted

    store = api.open_store(store_root)
    started = api.rollout_start(store, "m@2", steps="50,100", reason="from python")
    assert started.record is not None and started.record.canary == 2
    seen: list[int] = []
    done = api.rollout_run(store, "m", on_step=lambda out: seen.append(out.record.weight if out.record else -1))
    assert seen == [50, 100] and done.record is not None and done.record.state == "done"
    assert api.rollout_status(store, "m") == done.record
    api.rollout_start(store, "m@3", steps=[100], gates=["http:http://127.0.0.1:9/"])
    with pytest.raises(RolloutAborted) as failed:
        api.rollout_advance(store, "m", probing=Probing(tries=2, retry_s=0.01))
    assert failed.value.exit_code == 10 and "http:http://127.0.0.1:9/ failed" in str(failed.value)
    assert store.alias("m", "production") == 2
    render = api.rollout_render(store, "m", "json")
    assert isinstance(render, dict) and render["state"] == "aborted"


def test_apply_reads_the_rendered_router_configuration(mreg: Any, three: str, tmp_path: Path) -> None:
    import yaml

    out = tmp_path / "route.yaml"
    ok(mreg("rollout", "start", "m@2", "--steps", "30,100", "--apply-target", "gateway-api", "--apply",
            f"cat > {out}", "--json"))
    ok(mreg("rollout", "advance", "m", "--json"))
    (route,) = yaml.safe_load_all(out.read_text())
    assert route["kind"] == "HTTPRoute"
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [70, 30]
    r = mreg("rollout", "start", "m@3", "--steps", "100", "--apply-target", "istio", "--json")
    assert r.exit_code == 2 and "no render target" in r.json["error"]["message"]
