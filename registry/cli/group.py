"""The `mreg` group and its one error boundary: MregError → one line, a hint, an exit code (and a JSON document)."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from registry import __version__
from registry.cli.options import EVENTS_KEY, JSON_KEY
from registry.cli.render import Output
from registry.config import MREG_DEBUG
from registry.errors import EXIT_CODES, MregError, PermissionDenied, UsageError

#: errno values of a filesystem that refuses: permission denied, not permitted, read-only.
REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."


class ReportedFailure(Exception):
    """A command printed its report (the one JSON document) and still fails: only the error line remains."""

    def __init__(self, error: MregError) -> None:
        super().__init__(str(error))
        self.error = error


class MregGroup(click.Group):
    """A click group whose invoke is mreg's error boundary."""

    #: The command line being run (what `main` was given), for errors raised before `--json` was parsed.
    argv: tuple[str, ...] = ()

    def main(self, args: Sequence[str] | None = None, *a: Any, **kw: Any) -> Any:
        """Remember the command line, then run as click does."""
        MregGroup.argv = tuple(sys.argv[1:] if args is None else args)
        return super().main(args, *a, **kw)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; map MregError to one line, a hint and its exit code."""
        try:
            return self._invoke(ctx)
        finally:
            for notifier in ctx.meta.get(EVENTS_KEY, []):  # the changes are committed: only a warning remains
                for d in notifier.wait():
                    Output(False).warn(f"alias-change event not delivered to {d.url} after {d.tries} tries: "
                                       f"{d.detail}" + (f"; kept in {d.kept}" if d.kept else ""))

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except OSError as e:
                if isinstance(e, MregError) or e.errno not in REFUSED:
                    raise
                # A read-only store or cache can refuse any write, deep in any command: one line, not a traceback.
                raise PermissionDenied.from_os_error(e) from e
        except ReportedFailure as e:
            Output(False).error(e.error)
            ctx.exit(e.error.exit_code)
        except MregError as e:
            if MREG_DEBUG.value():
                traceback.print_exc()
            Output(self._json(ctx)).error(e)
            ctx.exit(e.exit_code)
        except click.UsageError as e:  # click prints its usage text on stderr; --json also gets its document
            if self._json(ctx):
                Output(True).document(UsageError(e.format_message(), hint="see `mreg COMMAND --help`"))
            raise
        except KeyboardInterrupt:
            sys.stderr.write("interrupted; nothing partial was published\n")
            ctx.exit(130)

    def _json(self, ctx: click.Context) -> bool:
        return bool(ctx.meta.get(JSON_KEY)) or "--json" in MregGroup.argv


@click.group(cls=MregGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mreg")
def main() -> None:
    """mreg: pull models into an explicit cache, convert and verify them, publish immutable
    versions to a store, and release them with atomic alias flips.

    \b
    The loop:
      mreg pull Qwen/Qwen2.5-7B-Instruct            # into --cache-dir, pinned to a commit
      mreg convert Qwen/Qwen2.5-7B-Instruct --to hf --name qwen   # new version in --store
      mreg promote qwen@1                           # production -> versions/1, atomically
      mreg resolve qwen@production --format hf      # the path a serving engine mounts
      mreg rollback qwen                            # production back to where it was
    """


#: Modules whose presence means thousands more were imported with them (torch and transformers: about 2,500).
HEAVY_MODULES = ("torch", "transformers", "onnxruntime", "tensorrt")


def run() -> None:
    """Console entry point.

    After a command that imported one of HEAVY_MODULES, Python's teardown of their modules takes
    about a second of the user's wall time once everything is done and printed. So the process ends
    there: exit handlers run and the streams are flushed first (every file mreg writes is closed and
    renamed into place before a command returns); what is skipped is the freeing of module objects
    and the joining of threads still running (a conversion's abandoned PyTorch reference, after an
    error or Ctrl-C).
    """
    try:
        main(prog_name="mreg")
    except SystemExit as done:
        if isinstance(done.code, int | None) and any(m in sys.modules for m in HEAVY_MODULES):
            _exit_now(done.code or 0)
        raise


def _exit_now(code: int) -> None:
    import atexit

    # Python has no public call for "run the exit handlers now"; os._exit skips them otherwise.
    atexit._run_exitfuncs()
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: what was written is lost, as Python says with 120
            code = code or 120
    os._exit(code)
