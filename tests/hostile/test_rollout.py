"""Hostile input to `mreg rollout` (issue 30): steps, gates, URLs, durations and config tables that could only fail
mid-rollout, an alias already under a rollout, a damaged rollout record. Each is refused before anything changes and
held to the corpus's promise (support.corpus)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.world import World

from registry import layout


def _on_1(*command: str | Path, config: str = "") -> Setup:
    """Versions 1 and 2 of m, production on 1; then `command` (with `--config` when a config table is given)."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(2)
        assert run("promote", "m@1").exit_code == 0
        if not config:
            return command
        path = w.root / "mreg.toml"
        path.write_text(config)
        return [*command, "--config", path]
    return setup


def _under_rollout(*command: str) -> Setup:
    """A rollout of m@2 running against production on 1; then `command`."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(3)
        assert run("promote", "m@1").exit_code == 0
        assert run("rollout", "start", "m@2", "--steps", "10,100").exit_code == 0
        return command
    return setup


def _damaged_record(content: bytes | None) -> Setup:
    """A rollout of m@2 whose record is then replaced by `content` (None: a symlink out of the store)."""
    def setup(w: World) -> Sequence[str | Path]:
        _under_rollout()(w)
        path = layout.rollout_path(w.store, "m", "production")
        path.unlink()
        if content is None:
            os.symlink(w.outside, path)
        else:
            path.write_bytes(content)
        return ["rollout", "status", "m"]
    return setup


def _start(*args: str) -> Setup:
    return _on_1("rollout", "start", "m@2", *args)


CASES = [
    Case("steps that repeat", _start("--steps", "5,5,100"), 2, "UsageError", ("rise strictly",)),
    Case("steps past 100", _start("--steps", "5,25,101"), 2, "UsageError", ("rise strictly",)),
    Case("steps that stop short of 100", _start("--steps", "5,25"), 2, "UsageError", ("rise strictly",)),
    Case("a step of 5,000 digits", _start("--steps", "9" * 5000), 2, "UsageError", ("whole percentages",)),
    Case("empty steps", _start("--steps", ""), 2, "UsageError"),
    Case("negative steps", _start("--steps", "-5,100"), 2, "UsageError", ("rise strictly",)),
    Case("no steps at all", _start(), 2, "UsageError", ("--steps",)),
    Case("an unknown gate kind", _start("--steps", "5,100", "--gate", "exec:rm -rf /"), 2, "UsageError",
         ("unknown gate kind",)),
    Case("a gate with no kind", _start("--steps", "5,100", "--gate", "http://127.0.0.1/health"), 2, "UsageError",
         ("no gate kind",)),
    Case("a Prometheus bound of NaN", _start("--steps", "5,100", "--gate", "prom:http://127.0.0.1:9090|up|<nan"),
         2, "UsageError", ("no bound",)),
    Case("a Prometheus bound of 1e999 (inf)",
         _start("--steps", "5,100", "--gate", "prom:http://127.0.0.1:9090|up|<1e999"), 2, "UsageError",
         ("not a finite number",)),
    Case("a Prometheus URL on file://", _start("--steps", "5,100", "--gate", "prom:file:///etc/passwd|up|<1"), 2,
         "UsageError", ("scheme",)),
    Case("a Prometheus query with open brackets",
         _start("--steps", "5,100", "--gate", "prom:http://127.0.0.1:9090|sum(rate(x[1m])|<1"), 2, "UsageError",
         ("brackets",)),
    Case("a hold of nan", _start("--steps", "5,100", "--gate", "prom:http://127.0.0.1:9090|up|<1|for=nan"), 2,
         "UsageError", ("not a duration",)),
    Case("an HTTP gate forging an error line",
         _start("--steps", "5,100", "--gate", "http:http://127.0.0.1/x\nerror: forged"), 2, "UsageError", ("URL",)),
    Case("a golden set named by a path", _start("--steps", "5,100", "--gate", "check:../../etc/passwd"), 2,
         "UsageError", ("golden set",)),
    Case("a gate of 5,000 characters", _start("--steps", "5,100", "--gate", "http:" + "x" * 5000), 2,
         "UsageError", ("at most",)),
    Case("an interval of ten years", _start("--steps", "5,100", "--interval", "87600h"), 2, "UsageError",
         ("week",)),
    Case("an interval of 1e999 seconds", _start("--steps", "5,100", "--interval", "1e999"), 2, "UsageError",
         ("not a duration",)),
    Case("an apply command of spaces", _start("--steps", "5,100", "--apply", "   "), 2, "UsageError",
         ("shell command",)),
    Case("an apply target no router is", _start("--steps", "5,100", "--apply", "true", "--apply-target", "../x"),
         2, "UsageError", ("no render target",)),
    Case("an alias too long for its canary", _start("--steps", "5,100", "--alias", "a" * 60), 2, "UsageError",
         ("64 characters",)),
    Case("the stable version as canary", _on_1("rollout", "start", "m@1", "--steps", "5,100"), 2, "UsageError",
         ("already the stable version",)),
    Case("config: steps of the wrong type", _on_1("rollout", "start", "m@2",
                                                   config="[models.m.rollout]\nsteps = 5\n"), 2, "UsageError",
         ("wrong type",)),
    Case("config: gates that are numbers", _on_1("rollout", "start", "m@2",
                                                 config="[models.m.rollout]\nsteps = [5, 100]\ngates = [1]\n"),
         2, "UsageError", ("wrong type",)),
    Case("config: an unknown key", _on_1("rollout", "start", "m@2",
                                         config="[models.m.rollout]\nsteps = [5, 100]\nrollback = true\n"),
         2, "UsageError", ("unknown keys",)),
    Case("config: [events] with a file:// URL", _on_1("rollout", "start", "m@2", "--steps", "5,100",
                                                      config='[events]\nurls = ["file:///etc/passwd"]\n'),
         2, "UsageError", ("scheme",)),
    Case("a second rollout of the alias", _under_rollout("rollout", "start", "m@3", "--steps", "5,100"), 5,
         "Conflict", ("already under a rollout",)),
    Case("promote during a rollout", _under_rollout("promote", "m@3"), 5, "Conflict", ("staged rollout",)),
    Case("rollback during a rollout", _under_rollout("rollback", "m", "--to", "1"), 5, "Conflict",
         ("staged rollout",)),
    Case("advance with no rollout", _on_1("rollout", "advance", "m"), 3, "NotFound", ("no rollout running",)),
    Case("render with no rollout", _on_1("rollout", "render", "m", "--target", "haproxy"), 3, "NotFound"),
    Case("status of a model that does not exist", _on_1("rollout", "status", "nosuch"), 3, "NotFound"),
    Case("a rollout record that is not JSON", _damaged_record(b"\xff{not json"), 4, "IntegrityError",
         ("does not parse",)),
    Case("a rollout record of another alias",
         _damaged_record(b'{"schema_version": 1, "name": "m", "alias": "staging"}'), 4, "IntegrityError"),
    Case("a rollout record that is a symlink out of the store", _damaged_record(None), 4, "IntegrityError"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_rollout(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)
