"""Hostile settings (issue 34): promotion hooks that could only fail after the flip, odd references and names,
values accepted silently, special files where a file is named, and identities that forge lines. Each case is held
to the corpus's promise (support.corpus); the flip-backs that must still end in exit 10 are plain tests below.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.world import World

from registry import layout

# -- promotion hooks: refused before the flip -------------------------------------------------------------------


def _production(w: World) -> int:
    return int(os.readlink(layout.alias_path(w.store, "m", "production")).rsplit("/", 1)[-1])


def _still_on_1(w: World, _error: dict[str, Any]) -> None:
    assert _production(w) == 1, "the alias moved"


def _hooked(config: str, *flags: str) -> Setup:
    """Two versions, production on 1, then `promote m@2` with this `[models.m]` table and these flags."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(2)
        assert run("promote", "m@1").exit_code == 0
        path = w.root / "mreg.toml"
        path.write_text(f"[models.m]\n{config}\n")
        return ["promote", "m@2", "--config", path, *flags]
    return setup


HOOK_CASES = [
    ('ready_url = "file:///etc/passwd"', (), "ready_url"),
    ('ready_cmd = "false"\nready_timeout = 1e308', (), "ready_timeout"),
    ('reload_url = "http://[::1"', (), "reload_url"),
    ('ready_url = "ftp://127.0.0.1/x"', (), "ready_url"),
    ('ready_url = "http://127.0.0.1:99999/ready"', (), "ready_url"),
    ('ready_url = "http:///ready"', (), "ready_url"),
    ('ready_url = "http://127.0.0.1/ready\\nerror: forged"', (), "ready_url"),
    ("reload = 5", (), "reload"),
    ('reload = ["systemctl", "reload"]', (), "reload"),
    ('ready_cmd = "true"\nready_timeout = nan', (), "ready_timeout"),
    ('ready_cmd = "true"\nready_timeout = -1', (), "ready_timeout"),
    ('ready_cmd = "true"\nready_timeout = 0', (), "ready_timeout"),
    ("", ("--ready-url", "file:///etc/passwd"), "--ready-url"),
    ("", ("--reload-url", "http://[::1"), "--reload-url"),
    ("", ("--ready-cmd", "true", "--ready-timeout", "inf"), "--ready-timeout"),
    ("", ("--ready-cmd", "true", "--ready-timeout", "1e308"), "--ready-timeout"),
    ("", ("--ready-cmd", "true", "--ready-timeout", "nan"), "--ready-timeout"),
]

# -- references and names -----------------------------------------------------------------------------------------


def _published(*command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        return command
    return setup


def _promoted(*command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(2)
        assert run("promote", "m@1").exit_code == 0
        assert run("promote", "m@2").exit_code == 0
        return command
    return setup


REF_CASES = [
    *(Case(f"show m@{shown}", _published("show", f"m@{ref}"), 2, "UsageError", ("bad reference",))
      for shown, ref in (("² (superscript two)", "²"), ("١ (Arabic-Indic one)", "١"), ("5,000 digits", "9" * 5000),
                         ("a 19-letter alias of digits and letters", "9" * 18 + "z"))),
    Case("resolve m@١", _published("resolve", "m@١"), 2, "UsageError", ("bad reference",)),
    Case("promote m@²", _published("promote", "m@²"), 2, "UsageError", ("bad reference",)),
    Case("a model name ending in a newline", lambda w: ["convert", w.src, "--to", "hf", "--name", "evil\n"], 2,
         "UsageError", ("bad model name",)),
    Case("an alias ending in a newline", _published("promote", "m@1", "--alias", "prod\n"), 2, "UsageError",
         ("bad alias name",)),
    Case("a reference ending in a newline", _published("show", "m@1\n"), 2, "UsageError", ("bad reference",)),
    Case("--expect ²", _published("promote", "m@1", "--expect", "²"), 2, "UsageError", ("--expect",)),
]

# -- values accepted silently --------------------------------------------------------------------------------------

VALUE_CASES = [
    Case("gc --keep-latest -1", _published("gc", "--yes", "--keep-latest", "-1"), 2, "UsageError",
         ("--keep-latest",)),
    Case("gc --keep-history -1", _published("gc", "--yes", "--keep-history", "-1"), 2, "UsageError",
         ("--keep-history",)),
    Case("gc --grace-hours nan", _published("gc", "--grace-hours", "nan"), 2, "UsageError", ("--grace-hours",)),
    *(Case(f"rollback --to {to}", _promoted("rollback", "m", "--to", to), 2, "UsageError", ("--to",))
      for to in ("0", "-3", "²", "x")),
    # every number an option takes: ASCII digits (int() reads '١' as 1), finite, in its range
    *(Case(" ".join(argv), _published(*argv), 2, "UsageError", (argv[-2], "takes")) for argv in [
        ("gc", "--keep-latest", "١"), ("gc", "--keep-history", "²"), ("gc", "--grace-hours", "inf"),
        ("show", "m@1", "--memory", "nan"), ("show", "m@1", "--memory", "0"), ("show", "m@1", "--memory", "1e400"),
        ("show", "m@1", "--memory", "80", "--context", "١٠"), ("show", "m@1", "--memory", "80", "--utilization", "2"),
        ("show", "m@1", "--memory", "80", "--reserve", "-1"), ("sync", "s3://b/p", "m", "--watch", "nan"),
        ("sync", "s3://b/p", "m", "--watch", "0"), ("convert", "m@1", "--to", "gguf:Q4_K_M", "--eval-tokens", "0"),
        ("convert", "m@1", "--to", "gguf:Q4_K_M", "--calibration-ctx", "²"),
        ("promote", "m@1", "--ready-cmd", "true", "--ready-timeout", "١"),
    ]),
]

# -- special files where a file is named ---------------------------------------------------------------------------


def _fifo(w: World) -> Path:
    path = w.root / "pipe"
    if not path.exists():
        os.mkfifo(path)
    return path


def _binary(w: World) -> Path:
    path = w.root / "golden.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "x"}\n\xff\xfe\x00\x01 binary\n')
    return path


def _golden(make: Any) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        return ["check", "m@1", "--golden", make(w)]
    return setup


def _rope(scaling: Any) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        config = json.loads((w.src / "config.json").read_text())
        (w.src / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
        return ["convert", w.src, "--to", "gguf:F16", "--name", "m"]
    return setup


def _conf(make: Any) -> Setup:
    return lambda w: ["list", "--config", make(w)]


def _signed_with_trust(key: Any) -> Setup:
    """m@1 signed with a real key, then `promote --require signature` with `key(w)` as the trusted key."""
    def setup(w: World) -> Sequence[str | Path]:
        from support.pki import write_key

        w.publish()
        pair, _ = write_key(w.root / "pki", "release")
        assert run("sign", "m@1", "--key", pair.private).exit_code == 0
        config = w.root / "trust.toml"
        config.write_text(f"[trust]\nkeys = [{json.dumps(str(key(w)))}]\n")
        return ["promote", "m@1", "--require", "signature", "--config", config]
    return setup


FILE_CASES = [
    Case("sign --key /dev/zero", _published("sign", "m@1", "--key", "/dev/zero"), 2, "UsageError",
         ("--key", "character device")),
    Case("sign --import a FIFO", lambda w: [*_published("sign", "m@1", "--import")(w), _fifo(w)], 2, "UsageError",
         ("--import", "FIFO")),
    Case("a trusted key that is /dev/zero", _signed_with_trust(lambda w: "/dev/zero"), 2, "UsageError",
         ("trusted key", "character device")),
    Case("a trusted key that is a FIFO", _signed_with_trust(_fifo), 2, "UsageError", ("trusted key", "FIFO")),
    Case("--golden /dev/zero", _golden(lambda w: "/dev/zero"), 2, "UsageError", ("character device",)),
    Case("--golden a FIFO", _golden(_fifo), 2, "UsageError", ("FIFO",)),
    Case("--golden a directory", _golden(lambda w: w.outside), 2, "UsageError", ("directory",)),
    Case("--golden binary", _golden(_binary), 2, "UsageError", ("not UTF-8",)),
    Case("--golden missing", _golden(lambda w: w.root / "absent.jsonl"), 3, "NotFound", ("no such file",)),
    Case("--evaluation /dev/zero", lambda w: ["convert", w.src, "--to", "gguf:auto", "--evaluation", "/dev/zero",
                                              "--name", "m"], 2, "UsageError", ("character device",)),
    Case("--evaluation a FIFO", lambda w: ["convert", w.src, "--to", "gguf:auto", "--evaluation", _fifo(w),
                                           "--name", "m"], 2, "UsageError", ("FIFO",)),
    Case("--imatrix /dev/zero", lambda w: ["convert", w.src, "--to", "gguf:Q4_K_M", "--imatrix", "/dev/zero",
                                           "--name", "m"], 2, "UsageError", ("character device",)),
    Case("--calibration a FIFO", lambda w: ["convert", w.src, "--to", "gguf:Q4_K_M", "--calibration", _fifo(w),
                                            "--name", "m"], 2, "UsageError", ("FIFO",)),
    Case("--config /dev/zero", _conf(lambda w: "/dev/zero"), 2, "UsageError", ("character device",)),
    Case("--config a FIFO", _conf(_fifo), 2, "UsageError", ("FIFO",)),
    Case("--config /etc", _conf(lambda w: "/etc"), 2, "UsageError", ("directory",)),
    Case("--config binary", _conf(_binary), 2, "UsageError", ("not UTF-8",)),
    Case("rope_scaling factor 'big'", _rope({"type": "yarn", "factor": "big"}), 4, "InconsistentModel",
         ("rope_scaling.factor",)),
    Case("rope_scaling a list", _rope([1, 2]), 4, "InconsistentModel", ("rope_scaling",)),
    Case("rope_scaling original context 10**40", _rope({"type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 10**40}),
         4, "InconsistentModel", ("original_max_position_embeddings",)),
]

# -- messages -------------------------------------------------------------------------------------------------------


def _huge_pull(w: World) -> Sequence[str | Path]:
    assert w.hub is not None
    w.hub.add_commit("org/huge", {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"x" * 64})
    w.hub.announce_size("org/huge", "model.safetensors", 10**15)
    return ["pull", "org/huge", "--endpoint", w.hub.endpoint]


MESSAGE_CASES = [
    Case("a pull larger than the disk names the margin it keeps", _huge_pull, 7, "InsufficientSpace",
         ("needs 909.5 TiB plus a 64.0 MiB safety margin",), needs="hub"),
]

CASES: list[Case] = [
    *(Case(f"hook {(cfg or ' '.join(flags))!r}", _hooked(cfg, *flags), 2, "UsageError", (says,), check=_still_on_1)
      for cfg, flags, says in HOOK_CASES),
    *REF_CASES, *VALUE_CASES, *FILE_CASES, *MESSAGE_CASES,
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_setting(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)


# -- settings from the environment: the same promise, with the variable set for the one run ------------------------

ENV_CASES: list[tuple[str, str, Case]] = [
    ("MREG_GGUF_QUANTIZER", "evil", Case("MREG_GGUF_QUANTIZER=evil", lambda w: [
        "convert", w.src, "--to", "gguf:F16", "--name", "m"], 2, "UsageError", ("MREG_GGUF_QUANTIZER", "numpy"))),
    ("MREG_GGUF_DIRECT_IO", "maybe", Case("MREG_GGUF_DIRECT_IO=maybe", lambda w: [
        "convert", w.src, "--to", "gguf:F16", "--name", "m"], 2, "UsageError", ("MREG_GGUF_DIRECT_IO", "0 or 1"))),
    ("MREG_CONFIG", "/dev/zero", Case("MREG_CONFIG=/dev/zero", lambda w: ["list"], 2, "UsageError",
                                      ("character device",))),
    ("MREG_CONFIG", "/etc", Case("MREG_CONFIG=/etc", lambda w: ["list"], 2, "UsageError", ("directory",))),
    ("MREG_CACHE_DIR", "/dev/null", Case("MREG_CACHE_DIR=/dev/null", lambda w: [
        "convert", w.src, "--to", "hf", "--name", "m"], 2, "UsageError", ("/dev/null", "not a directory"))),
    ("MREG_USER", "x\nerror: forged", Case("MREG_USER with a newline", _published("promote", "m@1"), 2,
                                           "UsageError", ("MREG_USER",))),
    ("MREG_USER", "x" * 300, Case("MREG_USER of 300 characters", _published("promote", "m@1"), 2, "UsageError",
                                  ("MREG_USER",))),
    ("MREG_USER", "ci\x1b[2J", Case("MREG_USER with an escape sequence: convert", lambda w: [
        "convert", w.src, "--to", "hf", "--name", "m"], 2, "UsageError", ("MREG_USER",))),
    ("MREG_USER", "ci\rerror: forged", Case("MREG_USER with a carriage return: pull", lambda w: ["pull", w.src], 2,
                                            "UsageError", ("MREG_USER",))),
]


@pytest.mark.parametrize(("var", "value", "case"), ENV_CASES, ids=[c.id for _v, _x, c in ENV_CASES])
def test_hostile_environment(var: str, value: str, case: Case, request: pytest.FixtureRequest,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    def setup(w: World) -> Sequence[str | Path]:
        argv = case.setup(w)  # built without the variable (publishing stamps MREG_USER)
        monkeypatch.setenv(var, value)
        return argv

    check_case(dataclasses.replace(case, setup=setup), request)


# -- after the flip, every failure flips back and exits 10 --------------------------------------------------------


@pytest.fixture
def on_one(world: World) -> World:
    """m@1 and m@2 published, production on 1."""
    world.publish(2)
    assert run("promote", "m@1").exit_code == 0
    return world


def _flipped_back(w: World, argv: Sequence[str | Path], *says: str) -> dict[str, Any]:
    r = run(*argv, "--json")
    assert r.exit_code == 10, r.stderr + r.stdout
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert "flipped back to 1" in doc["error"]["message"], doc
    for word in says:
        assert word in doc["error"]["message"], (word, doc)
    assert _production(w) == 1
    actions = [(e["action"], e["from"], e["to"]) for e in run("history", "m", "--json").json["entries"]]
    assert actions[-2:] == [("promote", 1, 2), ("rollback", 2, 1)]
    return dict(doc)


@pytest.fixture
def garbage_server() -> Iterator[str]:
    """A TCP server that answers every request with bytes that are not HTTP (http.client's BadStatusLine)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HELLO THIS IS NOT HTTP\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/ready"
    stop.set()
    server.close()


@pytest.mark.slow
def test_an_engine_answering_garbage_flips_back(on_one: World, garbage_server: str) -> None:
    """http.client's BadStatusLine is not an OSError: it ended in a traceback with production on 2."""
    _flipped_back(on_one, ["promote", "m@2", "--ready-url", garbage_server, "--ready-timeout", "0.5"],
                  "BadStatusLine")


@pytest.mark.slow
def test_a_reload_command_that_outlives_the_timeout_flips_back(on_one: World) -> None:
    """subprocess's TimeoutExpired ended in a traceback with production on 2."""
    _flipped_back(on_one, ["promote", "m@2", "--reload", "sleep 5", "--ready-timeout", "0.5"], "did not finish")


def test_a_reload_command_writing_binary_flips_back(on_one: World) -> None:
    """Output that is not text (it was decoded strictly) ended in UnicodeDecodeError with production on 2."""
    _flipped_back(on_one, ["promote", "m@2", "--reload", r"printf '\377\376\000 x\n' >&2; exit 3"], "exited 3")


def test_a_reload_command_that_starts_an_engine_in_the_background_returns(on_one: World) -> None:
    """`engine &` keeps the command's output open: mreg read it through a pipe and waited for the engine to end."""
    import time

    t0 = time.monotonic()
    r = run("promote", "m@2", "--reload", "sleep 20 &", "--ready-cmd", "true", "--json")
    assert r.exit_code == 0 and r.json["hooks"]["ready"] is True, r.stderr
    assert time.monotonic() - t0 < 10, "waited for the background process"
    assert _production(on_one) == 2


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_interrupt_while_waiting_flips_back(sig: str, on_one: World) -> None:
    """Ctrl-C, or a cancelled CI job's SIGTERM, while mreg waits for the engine: the engine's state is unknown, so
    the alias goes back (SIGTERM ended the process with the flip standing)."""
    mreg = Path(sys.executable).parent / "mreg"
    argv = [str(mreg)] if mreg.exists() else [sys.executable, "-c", "from registry.cli import run; run()"]
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored, as POSIX has it: the
    # child gets the default back, as under a terminal or a CI job.
    p = subprocess.run([*argv, "promote", "m@2", "--ready-cmd", f"kill -{sig} $PPID; sleep 5", "--ready-timeout",
                        "30", "--json"], capture_output=True, text=True, timeout=60, env={**os.environ},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 10, p.stderr + p.stdout
    assert "Traceback" not in p.stderr
    assert "interrupted" in json.loads(p.stdout)["error"]["message"]
    assert _production(on_one) == 1


def test_settings_are_checked_before_the_flip_whatever_the_caller(on_one: World) -> None:
    """A library caller's Hooks are checked as the CLI's are, before anything moves."""
    from registry import api
    from registry.errors import UsageError
    from registry.refs import parse_ref
    from registry.release.hooks import Hooks, promote_with_hooks

    store = api.open_local_store(on_one.store)
    version = store.resolve(parse_ref("m@2"))
    with pytest.raises(UsageError, match="--ready-url"):
        promote_with_hooks(store, "m", version, Hooks(ready_url="file:///etc/passwd"))
    with pytest.raises(UsageError, match="ready-timeout"):
        promote_with_hooks(store, "m", version, Hooks(ready_cmd="true", ready_timeout_s=float("inf")))
    assert _production(on_one) == 1


def test_history_prints_what_it_records_on_one_line(on_one: World) -> None:
    """A reason (or an identity recorded before this check) with a newline cannot forge a line of `history`."""
    assert run("promote", "m@2", "-m", "fine\nerror: forged").exit_code == 0
    out = run("history", "m").stdout
    assert not any(line.startswith("error:") for line in out.splitlines()), out
    assert "fine\\nerror: forged" in out


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_registry_auth_file_that_is_not_a_file_is_refused(special: str, tmp_path: Path) -> None:
    """REGISTRY_AUTH_FILE=/dev/zero was read until memory ran out; a FIFO waited forever for a writer."""
    from registry.errors import UsageError
    from registry.oci.auth import lookup

    path = Path(special)
    if special == "fifo":
        path = tmp_path / "auth.json"
        os.mkfifo(path)
    with pytest.raises(UsageError, match=r"character device|FIFO"):
        lookup("registry.example", path)
    assert lookup("registry.example", tmp_path / "absent.json") is None


@pytest.mark.slow
def test_a_linked_import_asks_for_no_cache_space_and_a_copy_names_the_margin(world: World,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's filesystem reported with 1 MiB free (the only thing faked: the free-space query): a linked
    import writes no file bytes into the cache and goes ahead; a copy is refused, naming the margin it keeps."""
    import shutil
    import time

    from registry.cache import plan

    src = world.src
    time.sleep(2.1)  # files younger than 2 s are copied, whatever is asked (their identity cannot prove them)
    real = shutil.disk_usage
    monkeypatch.setattr(plan.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    r = run("pull", src, "--json")
    assert r.exit_code == 0, r.stderr
    r = run("pull", src, "--copy", "--json")
    assert r.exit_code == 7, r.stderr
    assert "64.0 MiB safety margin" in r.json["error"]["message"] and "1.0 MiB free" in r.json["error"]["message"]

