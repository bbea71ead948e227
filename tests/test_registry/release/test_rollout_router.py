"""A staged rollout through a real router: HAProxy in front of two llama.cpp servers (`llama_cpp.server`), one on
the alias's path and one on the canary alias's path, weights applied over HAProxy's runtime API by the --apply
command, and a real Prometheus scraping HAProxy's own exporter every second for the gate.

Measured: the share of each server at each step (over a few hundred requests), requests lost during every weight
change and the final flip, and the time from a killed canary to the rollout's abort with traffic back on stable.
Without haproxy or prometheus the test skips naming the install command; with MREG_REQUIRE_ROUTER=1 (CI) it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok

INSTALL = "apt-get install -y --no-install-recommends haproxy prometheus"
REQUIRE_ENV = "MREG_REQUIRE_ROUTER"
REQUESTS_PER_STEP = 400
#: HAProxy's weighted round robin keeps each server's place in its schedule across a weight change: the requests
#: after one can lean to a server, for a few hundred of them when the change lands at a bad place in the schedule
#: (measured once: 58.75 % to a canary at 50 after 200 requests). The share is measured once a window of WINDOW
#: requests, taken from SETTLE on and at most MAX_SETTLE, lands within TOLERANCE: a weight HAProxy never took
#: never settles, and fails.
SETTLE = 200
WINDOW = 100
MAX_SETTLE = 2000
#: The measured share may miss the weight by this many points (HAProxy's weighted round robin is exact over a
#: multiple of the weights' sum; a health check or a retry can shift a request or two).
TOLERANCE = 4.0


def _binaries() -> tuple[str, str]:
    haproxy, prometheus = shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy"), shutil.which("prometheus")
    if not haproxy or not prometheus:
        message = f"haproxy and prometheus are needed for the real-router rollout test: {INSTALL}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return haproxy, prometheus


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ready within {timeout:g}s")
        time.sleep(0.1)


def _get(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class Router:
    """HAProxy (frontend, a backend `llm` with servers `stable` and `canary`, the Prometheus exporter on /metrics),
    Prometheus scraping it every second, and the llama.cpp servers behind it."""

    def __init__(self, work: Path, haproxy: str, prometheus: str) -> None:
        self.work = work
        self.sock = Path(tempfile.mkdtemp(prefix="mreg-ha-")) / "admin.sock"  # a unix socket path is short
        self.front, self.prom_port = _port(), _port()
        self.ports = {"stable": _port(), "canary": _port()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        cfg = work / "haproxy.cfg"
        servers = "".join(f"    server {s} 127.0.0.1:{p} weight {100 if s == 'stable' else 0} check inter 200ms "
                          "fall 1 rise 1\n" for s, p in self.ports.items())
        cfg.write_text(
            f"global\n    stats socket {self.sock} mode 600 level admin\n"
            "defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n    timeout server 30s\n"
            "    retries 3\n    option redispatch 1\n"
            f"frontend fe\n    bind 127.0.0.1:{self.front}\n"
            "    http-request use-service prometheus-exporter if { path /metrics }\n    default_backend llm\n"
            f"backend llm\n    balance roundrobin\n{servers}")
        self._start("haproxy", [haproxy, "-f", str(cfg), "-db"])
        prom = work / "prometheus.yml"
        prom.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                        f"  - job_name: haproxy\n    static_configs:\n      - targets: ['127.0.0.1:{self.front}']\n")
        self._start("prometheus", [prometheus, f"--config.file={prom}", f"--storage.tsdb.path={work / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.prom_port}"])
        self.url = f"http://127.0.0.1:{self.front}"
        self.prom = f"http://127.0.0.1:{self.prom_port}"

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        log.close()

    def engine(self, server: str, model: str) -> None:
        """A llama.cpp server for `server` (stable or canary) on a GGUF path, once it answers."""
        self._start(f"llama-{server}", [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host",
                                        "127.0.0.1", "--port", str(self.ports[server]), "--n_ctx", "64"])
        _wait(f"llama.cpp {server}", lambda: _get(f"http://127.0.0.1:{self.ports[server]}/v1/models"))

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        shutil.rmtree(self.sock.parent, ignore_errors=True)

    def apply_command(self, log: Path) -> str:
        """The --apply command: both weights over HAProxy's runtime API, one line per call in `log`."""
        script = self.work / "apply.py"
        script.write_text(
            "import os, socket, sys, time\n"
            "w = int(os.environ['MREG_CANARY_WEIGHT'])\n"
            "assert f'server canary canary:8080 weight {w} check' in sys.stdin.read()  # --apply-target haproxy\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"s.connect({str(self.sock)!r})\n"
            "s.sendall(f'set weight llm/stable {100 - w}; set weight llm/canary {w}\\n'.encode())\n"
            "s.shutdown(socket.SHUT_WR)\n"
            "answer = s.recv(4096).decode().strip()\n"
            "assert not answer, answer\n"
            f"open({str(log)!r}, 'a').write(f\"{{time.time()}} {{w}} {{os.environ['MREG_ROLLOUT_STATE']}}\\n\")\n")
        return f"{sys.executable} {script}"


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    pytest.importorskip("llama_cpp.server.app")
    haproxy, prometheus = _binaries()
    r = Router(tmp_path, haproxy, prometheus)
    try:
        _wait("haproxy", lambda: urllib.request.urlopen(f"{r.url}/metrics", timeout=2).status == 200)
        yield r
    finally:
        r.close()


class Traffic:
    """Requests sent through HAProxy without pause from a thread: which server answered each one, or that it was
    lost (an error or a non-2xx answer)."""

    def __init__(self, url: str, servers: dict[str, str]) -> None:
        self.url, self.servers = url, servers
        self.log: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _one(self) -> str:
        try:
            model = _get(f"{self.url}/v1/models", timeout=5)["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError):
            return "lost"
        return self.servers.get(model, f"unknown {model}")

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.log.append((time.time(), self._one()))

    def since(self, t: float) -> list[str]:
        return [who for at, who in list(self.log) if at >= t]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def _share(traffic: Traffic, weight: float) -> float:
    """The canary's share (percent) over REQUESTS_PER_STEP requests of the one client (a second client interleaving
    with it would sample HAProxy's round robin unevenly), once the schedule has settled on `weight` (SETTLE,
    WINDOW); none may be lost."""
    t = time.time()

    def requests(start: int, n: int) -> list[str]:
        _wait("requests through haproxy", lambda: len(traffic.since(t)) >= start + n, timeout=60)
        answers = traffic.since(t)[start:start + n]
        assert set(answers) <= {"stable", "canary"}, answers
        return answers

    start = SETTLE
    while start < MAX_SETTLE and abs(100.0 * requests(start, WINDOW).count("canary") / WINDOW - weight) > TOLERANCE:
        start += WINDOW
    answers = requests(start + WINDOW, REQUESTS_PER_STEP)
    return 100.0 * answers.count("canary") / len(answers)


def _cli(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "from registry.cli import run; run()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_rollout_through_haproxy_with_a_prometheus_gate(mreg: Any, router: Router, tmp_path: Path,
                                                        store_root: Path) -> None:
    from support.tiny_models import build_tiny_llama

    for seed in (1, 2):
        src = build_tiny_llama(tmp_path / f"llama{seed}", seed=seed)
        ok(mreg("convert", src, "--to", "gguf:F16", "--name", "m", "--json"))
    ok(mreg("promote", "m@1", "--json"))
    stable_gguf = ok(mreg("resolve", "m@production", "--format", "gguf", "--json"))["path"]
    router.engine("stable", stable_gguf)
    log = tmp_path / "applied"
    gate = (f'prom:{router.prom}|haproxy_server_status{{proxy="llm",server="canary",state="DOWN"}}|<1|for=1s')
    figures: dict[str, Any] = {"shares": {}}

    down = "haproxy_server_status{proxy=%22llm%22,server=%22canary%22,state=%22DOWN%22}"

    def canary_up() -> bool:
        result = _get(f"{router.prom}/api/v1/query?query={down}")["data"]["result"]
        return bool(result) and result[0]["value"][1] == "0"

    def start() -> str:
        ok(mreg("rollout", "start", "m@2", "--steps", "10,50,100", "--interval", "30s", "--gate", gate,
                "--apply", router.apply_command(log), "--apply-target", "haproxy", "--json"))
        canary_gguf: str = ok(mreg("resolve", "m@production-canary", "--format", "gguf", "--json"))["path"]
        router.engine("canary", canary_gguf)
        _wait("prometheus seeing the canary up", canary_up, timeout=30)  # HAProxy's check, then a scrape
        return canary_gguf

    canary_gguf = start()
    servers = {stable_gguf: "stable", canary_gguf: "canary"}
    traffic = Traffic(router.url, servers)
    try:
        # 1. a canary that dies at 10 %: the Prometheus gate aborts the rollout by itself, `run` exits 10
        t_step = time.time()
        ok(mreg("rollout", "advance", "m", "--json"))
        figures["shares"]["10 (first rollout)"] = _share(traffic, 10)
        assert abs(figures["shares"]["10 (first rollout)"] - 10) <= TOLERANCE, figures
        assert traffic.since(t_step).count("lost") == 0
        run = _cli("rollout", "run", "m", "--json")
        time.sleep(1.5)  # `run` is waiting out the 30 s interval, watching the gate
        assert run.poll() is None
        t_kill = time.time()
        router.kill("llama-canary")
        out, err = run.communicate(timeout=60)
        t_abort = time.time()
        assert run.returncode == 10, err.decode()
        doc = json.loads(out)
        assert doc["rollout"]["state"] == "aborted" and doc["error"]["type"] == "RolloutAborted"
        assert "haproxy_server_status" in doc["error"]["message"] and "value 1" in doc["error"]["message"]
        zero = [float(line.split()[0]) for line in log.read_text().splitlines() if line.split()[2] == "aborted"]
        figures["kill_to_weight_0_s"] = round(zero[0] - t_kill, 2)
        figures["kill_to_run_exit_s"] = round(t_abort - t_kill, 2)
        figures["lost_after_kill"] = traffic.since(t_kill).count("lost")
        _wait("traffic after the abort", lambda: len(traffic.since(t_abort)) >= 20, timeout=20)
        after = traffic.since(t_abort)
        assert after and set(after) == {"stable"}, "every request after the abort is answered by the stable engine"
        assert _share(traffic, 0) == 0.0
        hist = ok(mreg("history", "m", "--json"))["entries"]
        assert hist[-1]["action"] == "rollout-abort" and "automatic abort: gate prom:" in hist[-1]["reason"]
        assert hist[-1]["rollout"]["gates"][0]["value"] == 1.0
        assert os.readlink(store_root / "models/m/production") == "versions/1"
        assert not os.path.lexists(store_root / "models/m/production-canary")

        # 2. the same version again, healthy this time: every step measured, nothing lost, the alias flips
        router.kill("llama-canary")
        start()
        lost_at: dict[str, int] = {}
        for weight in (10, 50, 100):
            t_step = time.time()
            rec = ok(mreg("rollout", "advance", "m", "--json"))["rollout"]
            assert rec["weight"] == weight
            figures["shares"][str(weight)] = _share(traffic, weight)
            lost_at[str(weight)] = traffic.since(t_step).count("lost")
            assert abs(figures["shares"][str(weight)] - weight) <= TOLERANCE, figures
        figures["lost_at_each_step"] = lost_at
        assert rec["state"] == "done" and os.readlink(store_root / "models/m/production") == "versions/2"
        assert sum(lost_at.values()) == 0, figures
    finally:
        traffic.close()
    figures["requests_sent"] = len(traffic.log)
    sys.stderr.write(f"rollout figures: {json.dumps(figures)}\n")
    (tmp_path / "figures.json").write_text(json.dumps(figures))
