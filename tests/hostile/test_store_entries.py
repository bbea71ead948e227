"""Issue 34, the local store's readers: entries of a store that mreg did not write (an alias that is not a link, a
version named `01`, `²` or `١`, a file where a version's directory belongs, a directory where a manifest, a blob or
a lock file belongs, a garbage record, a manifest that names another version) and a model directory the user
cannot read. Each reader names the entry and exits 4 (1 for a refused read); gc removes nothing while one is there.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.world import World

from registry import atomic, layout

GC_ALL = ("gc", "--yes", "--keep-latest", "0", "--keep-history", "0")
READERS = (("list",), ("list", "m"), ("verify", "--all"), GC_ALL)


def _writable(path: Path) -> Path:
    """Make a published directory writable (versions are read-only) so that a case can damage it."""
    os.chmod(path, 0o755)
    return path


def _versions(count: int, *command: str, promote: int | None = None) -> Setup:
    """`count` versions of m published (production promoted to `promote`); the command to run."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(count)
        if promote is not None:
            assert run("promote", f"m@{promote}").exit_code == 0
        return command
    return setup


def _after(base: Setup, damage: Any) -> Setup:
    """`base`, then `damage(w)` done to what it published (LAYOUT: an OCI layout beside the store)."""
    def setup(w: World) -> Sequence[str | Path]:
        command = base(w)
        damage(w)
        return [c.replace("LAYOUT", f"oci-layout:{w.root / 'layout'}:v1") if isinstance(c, str) else c
                for c in command]
    return setup


def _m(w: World, *parts: str) -> Path:
    return layout.model_dir(w.store, "m").joinpath(*parts)


# -- what stands where an alias belongs --------------------------------------------------------------------------


def _alias_file(w: World) -> None:
    _m(w, "production").unlink()
    _m(w, "production").write_text("versions/1\n")


def _alias_dir(w: World) -> None:
    _m(w, "production").unlink()
    _m(w, "production", "hf").mkdir(parents=True)


def _alias_fifo(w: World) -> None:
    _m(w, "production").unlink()
    os.mkfifo(_m(w, "production"))


def _hand_made_link(w: World) -> None:
    """A link mreg would never make (not an alias name): gc cannot know what it keeps, so it keeps everything."""
    _m(w, "Serving").symlink_to("versions/1")


def _checks_linked(w: World) -> None:
    (w.outside / "checks").mkdir()
    _m(w, "checks").symlink_to(w.outside / "checks")


def _not_alias_checks(w: World, error: dict[str, Any]) -> None:
    assert "alias checks" not in error["message"], error["message"]


def _stray_file(w: World) -> None:
    _m(w, "notes.txt").write_text("who wrote this?")


# -- odd names and kinds in versions/ and signatures/ -------------------------------------------------------------


def _odd_version(name: str, *, copy: bool = False) -> Any:
    def damage(w: World) -> None:
        if copy:  # a copy of version 1 under another spelling of its number
            shutil.copytree(_m(w, "versions", "1"), _m(w, "versions", name), symlinks=True)
        else:
            _m(w, "versions", name).mkdir()
    return damage


def _odd_signatures(w: World) -> None:
    _m(w, "signatures", "²").mkdir(parents=True)


def _file_for_version(w: World) -> None:
    _m(w, "versions", "3").write_text("not a version")


def _dir_for_manifest(w: World) -> None:
    manifest = _m(w, "versions", "1", layout.MANIFEST)
    _writable(manifest.parent)
    manifest.unlink()
    manifest.mkdir()


def _fifo_for_manifest(w: World) -> None:
    manifest = _m(w, "versions", "1", layout.MANIFEST)
    _writable(manifest.parent)
    manifest.unlink()
    os.mkfifo(manifest)


def _dir_for_blob(w: World) -> None:
    manifest = json.loads(_m(w, "versions", "1", layout.MANIFEST).read_text())
    digest = next(f["sha256"] for f in manifest["artifacts"][0]["files"] if f["path"] == "config.json")
    blob = layout.blob_path(w.store, digest)
    _writable(blob.parent)
    blob.unlink()
    blob.mkdir()


def _dir_for_lock(rel: str) -> Any:
    def damage(w: World) -> None:
        path = w.store / rel
        path.unlink(missing_ok=True)
        path.mkdir()
    return damage


def _lock_linked_out(w: World) -> None:
    lock = _m(w, layout.ALIAS_LOCK)
    lock.unlink(missing_ok=True)
    lock.symlink_to(w.outside / "precious.txt")


def _record(kind: str, content: bytes | None) -> Any:
    """A record in checks/1 or signatures/1: these bytes, or a directory (None)."""
    def damage(w: World) -> None:
        path = _m(w, kind, "1", "20260101T000000000000Z-x.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
    return damage


def _manifest_says(**change: Any) -> Any:
    """Version 2's manifest rewritten to name another model or number (its digest is nobody's record)."""
    def damage(w: World) -> None:
        path = _m(w, "versions", "2", layout.MANIFEST)
        doc = json.loads(path.read_text())
        _writable(path.parent)
        path.unlink()
        path.write_text(json.dumps({**doc, **change}))
    return damage


# -- permissions ------------------------------------------------------------------------------------------------


def _unreadable(w: World) -> None:
    os.chmod(_m(w), 0)


def _readable_again(w: World, error: dict[str, Any]) -> None:
    os.chmod(_m(w), 0o755)
    assert str(_m(w)) in error["message"], error["message"]


def _baseline(content: bytes | None) -> Setup:
    """Version 1 of m and a golden set; its baseline these bytes (a directory: None). `check` reads the baseline
    before it loads the model."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(1)
        golden = w.root / "smoke.jsonl"
        golden.write_text(json.dumps({"id": "hello", "prompt": "Hello", "max_new_tokens": 2}) + "\n")
        path = layout.baseline_path(w.store, "m", "smoke")
        path.parent.mkdir(parents=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
        return ["check", "m@1", "--golden", golden]
    return setup


def _other_baseline() -> bytes:
    return json.dumps({"schema_version": 1, "name": "other", "golden": "smoke", "golden_sha256": "0" * 64,
                       "version": 1, "format": "hf", "by": {"user": "u", "host": "h", "at": "2026-01-01T00:00:00Z",
                                                            "mreg_version": "0", "python": "3"}}).encode()


def _cases() -> list[Case]:
    cases: list[Case] = []
    # severe 1: gc, given keep nothing, must keep everything while an alias cannot be read
    for what, damage in (("a regular file", _alias_file), ("a directory", _alias_dir), ("a FIFO", _alias_fifo)):
        # (mount-check reports a copy at the alias's place as a contract violation: exit 1, tested with it)
        for cmd in (GC_ALL, ("resolve", "m@production"), ("promote", "m@2"), ("list", "m"), ("show", "m@1")):
            cases.append(Case(f"alias production is {what}: {' '.join(cmd)}", _after(_versions(2, *cmd, promote=1),
                                                                                   damage),
                              4, "IntegrityError", ("production", what)))
    cases += [
        Case("a hand-made link beside the aliases: gc", _after(_versions(2, *GC_ALL, promote=2), _hand_made_link), 4,
             "IntegrityError", ("Serving",)),
        Case("a stray file beside the aliases: gc", _after(_versions(2, *GC_ALL), _stray_file), 4, "IntegrityError",
             ("notes.txt",)),
        *(Case(f"checks symlinked out: {' '.join(cmd)}", _after(_versions(1, *cmd, promote=1), _checks_linked), 4,
               "IntegrityError", (says, "symlink"), check=_not_alias_checks)
          for cmd, says in ((GC_ALL, "checks directory of m"), (("list", "m"), "checks directory of m"),
                            (("show", "m@1"), "checks directory of m"),
                            (("promote", "m@1", "--require", "check"), "checks of m@1"))),
    ]
    # odd names where version numbers belong, through every reader that lists versions
    for name, copy in (("²", False), ("01", True), ("١", False), ("1x", False)):
        for cmd in (*READERS, ("show", "m@latest")):
            cases.append(Case(f"versions/{name}: {' '.join(cmd)}",
                              _after(_versions(2, *cmd), _odd_version(name, copy=copy)), 4, "IntegrityError",
                              (f"versions/{name}", "version number")))
    for cmd in READERS:
        cases.append(Case(f"signatures/²: {' '.join(cmd)}", _after(_versions(2, *cmd), _odd_signatures), 4,
                          "IntegrityError", ("signatures/²",)))
    # a file where a version's directory belongs
    for cmd in (*READERS, ("show", "m@3"), ("promote", "m@3"), ("show", "m@latest")):
        cases.append(Case(f"versions/3 a file: {' '.join(cmd)}", _after(_versions(2, *cmd), _file_for_version), 4,
                          "IntegrityError", ("versions/3",)))
    # a directory (or a FIFO: never opened) where version 1's manifest belongs
    for what, damage in (("a directory", _dir_for_manifest), ("a FIFO", _fifo_for_manifest)):
        for cmd in (("show", "m@1"), ("verify", "m@1"), ("promote", "m@1"), ("rollback", "m"), ("mount-check", "m"),
                    *READERS):
            cases.append(Case(f"manifest.json {what}: {' '.join(cmd)}",
                              _after(_versions(2, *cmd, promote=1), damage) if cmd[0] != "rollback" else
                              _after(_rolled(*cmd), damage), 4, "IntegrityError", _names(cmd, "manifest.json", what)))
    cases += [
        *(Case(f"a blob a directory: {' '.join(cmd)}", _after(_versions(1, *cmd, promote=1), _dir_for_blob), 4,
               "IntegrityError") for cmd in (("verify", "m@1"), GC_ALL, ("mount-check", "m", "--verify"))),
        *(Case(f"{rel} a directory: {' '.join(cmd)}", _after(_versions(2, *cmd, promote=1), _dir_for_lock(rel)), 4,
               "IntegrityError", (rel.rsplit("/", 1)[-1], "lock file"))
          for rel, cmds in (("models/m/.lock", (("promote", "m@2"), ("rollback", "m"))),
                            ("gc.lock", (GC_ALL, ("convert", "SRC", "--to", "hf", "--name", "m"))))
          for cmd in cmds),
        Case("models/m/.lock a symlink out: promote", _after(_versions(2, "promote", "m@2"), _lock_linked_out), 4,
             "IntegrityError", (".lock", "symlink")),
        *(Case(f"checks/1 record {what}: promote --require check",
               _after(_versions(1, "promote", "m@1", "--require", "check"), _record("checks", content)), 4,
               "IntegrityError", ("checks of m@1",))
          for what, content in (("garbage", b"\x00\xff garbage"), ("a JSON array", b"[]"), ("a directory", None))),
        *(Case(f"signatures/1 record a directory: {' '.join(cmd)}", _after(_versions(1, *cmd), _record(
            "signatures", None)), 4, "IntegrityError", ("signatures of m@1",))
          for cmd in (("show", "m@1"), ("verify", "m@1", "--signatures"))),
        # a manifest that names another model or version than the directory it sits in
        *(Case(f"versions/2 manifest says {change}: {' '.join(cmd)}", _after(_versions(2, *cmd), _manifest_says(
            **change)), 4, "IntegrityError", says)
          for change in ({"name": "other"}, {"version": 3})
          for cmd in (("show", "m@2"), ("verify", "--all"), ("push", "m@2", "LAYOUT"), ("list", "m"), ("verify", "m@2"))
          for says in [("m@2",) if cmd[0] == "verify" else ("not m@2",)]),
        *(Case(f"baselines/smoke.json {what}: check", _baseline(content), 4, "IntegrityError", says)
          for what, content, says in (("garbage", b"\x00garbage", ("does not parse",)),
                                      ("a directory", None, ("a directory",)),
                                      ("another model's", _other_baseline(), ("not m's 'smoke'",)))),
        # permissions: a refused read is exit 1 naming the path, never "does not exist" or "damaged"
        *(Case(f"models/m unreadable: {' '.join(cmd)}", _after(_versions(1, *cmd, promote=1), _unreadable), 1,
               "PermissionDenied", ("permission denied",), unprivileged=True, check=_readable_again)
          for cmd in (("resolve", "m@production"), ("history", "m"), ("show", "m@1"), ("list", "m"),
                      ("rollback", "m"))),
    ]
    return cases


def _names(cmd: Sequence[str], *words: str) -> tuple[str, ...]:
    """What the error line must hold: verify's names the version (its report, the entry); the others the entry."""
    return ("m@1",) if cmd[0] == "verify" and cmd[1] != "--all" else words


def _rolled(*command: str) -> Setup:
    """Production promoted to 1, then 2: a rollback goes back to 1."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(2)
        for v in (1, 2):
            assert run("promote", f"m@{v}").exit_code == 0
        return command
    return setup


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_store_entry_gets_one_line_and_changes_nothing(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)


# -- what does not fit the table --------------------------------------------------------------------------------


def test_list_and_verify_go_on_past_a_stray_entry(world: World) -> None:
    """The good versions are listed and verified beside the named stray; once it is moved out, all is well."""
    world.publish(2)
    stray = _m(world, "versions", "²")
    stray.mkdir()
    listed = run("list", "m", "--json")
    assert listed.exit_code == 4 and [r["version"] for r in listed.json["versions"]] == [1, 2]
    assert len(listed.json["problems"]) == 1 and "versions/²" in listed.json["error"]["message"]
    verified = run("verify", "--all", "--json")
    assert verified.exit_code == 4 and [v["ok"] for v in verified.json["versions"]] == [True, True]
    assert "versions/²" in verified.json["problems"][0]
    everything = run("list", "--json")
    assert everything.exit_code == 4 and everything.json["models"][0]["versions"] == 2
    stray.rmdir()
    assert run("list", "m", "--json").exit_code == 0 and run("verify", "--all").exit_code == 0
    gc = run(*GC_ALL, "--json")
    assert gc.exit_code == 0 and [v["version"] for v in gc.json["versions"]] == [1, 2]


def test_gc_keeps_every_version_an_unreadable_alias_may_hold(world: World) -> None:
    """Severe item 1 end to end: the refusal leaves every version; with the alias a link again, gc keeps it."""
    world.publish(3)
    assert run("promote", "m@2").exit_code == 0
    _alias_dir(world)
    assert run(*GC_ALL).exit_code == 4
    assert run("list", "m", "--json").json["versions"] != []
    assert all(_m(world, "versions", str(n), layout.MANIFEST).is_file() for n in (1, 2, 3))
    shutil.rmtree(_m(world, "production"))
    _m(world, "production").symlink_to("versions/2")
    removed = run(*GC_ALL, "--json")
    assert removed.exit_code == 0 and sorted(v["version"] for v in removed.json["versions"]) == [1, 3]
    assert run("resolve", "m@production", "--json").json["version"] == 2


def test_a_second_gc_is_told_another_gc_holds_the_lock(world: World) -> None:
    world.publish(1)
    with atomic.flock(world.store / layout.GC_LOCK):  # what a running gc holds
        r = run("gc", "--yes", "--json")
    assert r.exit_code == 5 and "another gc" in r.json["error"]["message"], r.stdout
    with atomic.flock(world.store / layout.GC_LOCK, shared=True):  # what a publish holds
        r = run("gc", "--yes", "--json")
    assert r.exit_code == 5 and "publish is in progress" in r.json["error"]["message"], r.stdout


def test_convert_names_a_stray_number_and_publishes_nothing(world: World) -> None:
    """A conversion reads the versions to reuse one made from the same inputs: a stray there stops it (exit 4); once
    it is moved out, conversions publish again."""
    world.publish(1)
    _m(world, "versions", "2").write_text("not a version")
    r = run("convert", world.src, "--to", "hf", "--name", "m", "--json")
    assert r.exit_code == 4 and "versions/2" in r.json["error"]["message"], r.stdout
    assert sorted(os.listdir(_m(world, "versions"))) == ["1", "2"]
    os.rename(_m(world, "versions", "2"), world.root / "stray")
    world.publish(2)  # the second is new: the first is version 1, reused
    assert sorted(os.listdir(_m(world, "versions"))) == ["1", "2"]


def test_version_numbers_on_disk_are_ascii_digits_without_a_leading_zero() -> None:
    for good, n in (("1", 1), ("10", 10), ("999999999999999999", 10**18 - 1)):
        assert layout.parse_version(good) == n
    for bad in ("0", "01", "²", "١", "1\n", " 1", "+1", "-1", "1_0", "", "1" * 19, "1" * 5000):
        assert layout.parse_version(bad) is None, bad
    assert layout.parse_alias_target("versions/7") == 7
    assert layout.parse_alias_target("versions/٧") is None and layout.parse_alias_target("versions/07") is None


def test_an_s3_key_that_is_no_version_number_is_not_listed_as_one(s3_world: World) -> None:
    """`versions/²/` in a bucket was int("²"), a traceback: the S3 store reads numbers with the local store's rule."""
    w = s3_world
    w.pushed()
    for odd in ("²", "01", "١"):
        w.put(w.key(*layout.s3_versions("m"), odd, layout.MANIFEST), b"{}")
    listed = run("list", "m", "--store", w.remote, "--json")
    assert listed.exit_code == 0 and [v["version"] for v in listed.json["versions"]] == [1], listed.stdout
