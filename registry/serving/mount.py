"""The mount contract: an engine mounts the store root and reads `models/<name>/<alias>/<format>/…`.

`mount_check` verifies a deployment against it: the alias is a relative link that stays inside
the root, its target is a complete (and, on request, verified) version, and nothing under the
model is a separate mount (a Kubernetes `subPath` or a file bind mount pins one target and never
sees a flip). It also says which path each format's engine should be given.

A link that leads out of its place (the alias out of the root, or any symlink on the way to the
version's files) is reported apart, in `escapes`: an engine would serve bytes that are not the
store's, so the CLI makes it an integrity failure (exit 4) rather than a contract violation (exit 1).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from manifests import Artifact
from registry import atomic, layout
from registry.convert import formats
from registry.errors import IntegrityError, NotFound
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.verify import verify_version


@dataclass(frozen=True)
class MountReport:
    """The outcome of a mount check."""

    name: str
    alias: str
    version: int | None
    problems: tuple[str, ...]
    paths: dict[str, str] = field(default_factory=dict)
    #: The problems that are links leading out of their place (also in `problems`).
    escapes: tuple[str, ...] = ()
    #: With --verify: files whose bytes do not match their digests (also in `problems`).
    damaged: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the deployment meets the contract."""
        return not self.problems


def engine_path(base: Path, art: Artifact) -> Path:
    """The path to hand an engine for one artifact: its main file, or the directory (`hf`, `tensorrt`)."""
    return base / art.path / formats.get(art.format).mount_file(art)


def mount_check(store: LocalStore, name: str, alias: str = "production", *, mount_root: str | None = None,
                verify: bool = False, mountinfo: str = "/proc/self/mountinfo") -> MountReport:
    """Check one alias of one model against the mount contract."""
    problems: list[str] = []
    escapes: list[str] = []
    link = layout.alias_path(store.root, name, alias)
    if not layout.model_dir(store.root, name).is_dir():
        raise NotFound(f"model {name!r} is not in the store {store.root}", hint="run `mreg list`")
    if not link.is_symlink():
        return MountReport(name, alias, None, (f"{link} is not an alias symlink (missing, or a copy)",))
    target = os.readlink(link)
    if os.path.isabs(target):
        problems.append(f"{link} -> {target} is absolute: it breaks when the store is mounted elsewhere")
    real = Path(os.path.realpath(link))
    root = Path(os.path.realpath(store.root))
    if os.path.commonpath([real, root]) != str(root):
        escapes.append(f"{link} resolves to {real}, outside the store root {root}")
    number = layout.parse_alias_target(target)
    if number is None:
        problems.append(f"{link} -> {target} does not name a version")
        return _report(name, alias, None, problems, escapes)
    try:
        version = store.version(name, number)
    except NotFound:
        problems.append(f"{link} -> {target}: the version is incomplete or missing (no manifest)")
        return _report(name, alias, number, problems, escapes)
    except IntegrityError as e:
        if not (e.details and "link" in e.details):
            raise
        escapes.append(str(e))
        return _report(name, alias, number, problems, escapes)
    if verify:
        checked = verify_version(store, version)
        damaged = [f"{name}@{number}: {p}" for p in checked.problems if p not in checked.links]
        problems += damaged
        escapes += [f"{name}@{number}: {p}" for p in checked.links]
    else:
        _check_sizes(store, version, problems, escapes)
    problems += _separate_mounts(store.root, name, mountinfo)
    base = Path(mount_root) if mount_root else store.root
    alias_base = layout.alias_path(base, name, alias)
    paths = {str(a.format): str(engine_path(alias_base, a)) for a in version.manifest.artifacts}
    report = _report(name, alias, number, problems, escapes, paths)
    return dataclasses.replace(report, damaged=tuple(damaged)) if verify else report


def _check_sizes(store: LocalStore, version: Version, problems: list[str], escapes: list[str]) -> None:
    """Every file of the version is there with its size, reached through no symlink (an engine would follow it)."""
    for art in version.manifest.artifacts:
        for f in art.files:
            p = Path(version.path) / art.path / f.path
            where = f"{version.name}@{version.number}: {art.path}/{f.path}"
            if (stray := atomic.first_link(store.root, p)) is not None:
                escapes.append(f"{where}: {atomic.describe_link(store.root, stray)}")
            elif not p.is_file() or p.stat().st_size != f.size:
                problems.append(f"{where} is missing or has the wrong size")


def _report(name: str, alias: str, number: int | None, problems: list[str], escapes: list[str],
            paths: dict[str, str] | None = None) -> MountReport:
    """The report: every problem, the escaping links among them."""
    return MountReport(name, alias, number, (*problems, *escapes), paths or {}, tuple(escapes))


def _separate_mounts(root: Path, name: str, mountinfo: str) -> list[str]:
    """Mount points inside the model's directory: each pins what it covers and hides flips."""
    model = os.path.realpath(layout.model_dir(root, name))
    found = []
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) > 4:
            point = parts[4].replace("\\040", " ")
            if point == model or point.startswith(model + os.sep):
                found.append(f"{point} is a separate mount inside the model: engines there never see a flip "
                             "(mount the store root instead of a subPath or a single file)")
    return found
