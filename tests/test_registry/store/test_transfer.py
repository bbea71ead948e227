"""The one push core: every sink (S3, OCI) is driven through the same sequence by `registry.store.transfer.push`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from manifests import SignatureRecord
from registry.progress import Progress
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.transfer import PushOutcome, push


class CountingSink:
    """A sink that records what the core asks of it: `a` is there whole, `b` absent, `c` cut short, `d` there but
    damaged (its bytes fail their digest)."""

    workers = 1

    def __init__(self, *, there: bool = False, repairs: bool = True, renumbered: bool = False) -> None:
        self.there, self.repairs, self.renumbered = there, repairs, renumbered
        self.calls: list[str] = []

    def blobs(self, version: Version) -> dict[str, int]:
        self.calls.append("blobs")
        return {"a": 1, "b": 2, "c": 3, "d": 4}

    def existing(self, version: Version) -> tuple[Version, str] | None:
        self.calls.append("existing")
        return (version, "there") if self.there else None

    @contextmanager
    def sending(self, blobs: Iterable[str]) -> Iterator[None]:
        self.calls.append(f"sending {''.join(sorted(blobs))}")
        yield
        self.calls.append("sent")

    def sizes(self, blobs: list[str]) -> list[int | None]:
        self.calls.append(f"sizes {''.join(blobs)}")
        return [1, None, 1, 4]

    def damaged(self, present: dict[str, int], progress: Progress) -> list[str]:
        self.calls.append(f"damaged {''.join(present)}")
        return ["d"]

    def send_blob(self, local: LocalStore, blob: str, advance: Callable[[int], None]) -> int:
        self.calls.append(f"blob {blob}")
        advance(1)
        return 1 if blob == "c" else 0  # one byte of c was there from an interrupted upload

    def publish(self, version: Version) -> tuple[Version, str]:
        self.calls.append("manifest")
        number = version.number + 1 if self.renumbered else version.number
        sha = "0" * 64 if self.renumbered else version.manifest_sha256
        return dataclasses.replace(version, number=number, manifest_sha256=sha), "published"

    def send_signatures(self, records: list[SignatureRecord], published: Version) -> int:
        self.calls.append("signatures")
        return len(records)

    def outcome(self, common: PushOutcome) -> PushOutcome:
        self.calls.append("outcome")
        return dataclasses.replace(common, tag="t")


class Recorder:
    """A progress that keeps its events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def start(self, label: str, total: int) -> None:
        self.events.append(("start", total))

    def advance(self, n: int) -> None:
        self.events.append(("advance", n))

    def done(self) -> None:
        self.events.append(("done", None))


@pytest.fixture
def version(mreg: Any, model_dir: Path, store_root: Path) -> tuple[LocalStore, Version]:
    r = mreg("convert", model_dir, "--to", "hf", "--name", "m")
    assert r.exit_code == 0, r.stderr
    local = LocalStore(store_root)
    return local, local.version("m", 1)


def test_the_core_sends_missing_blobs_by_size_then_the_manifest_then_signatures(
        version: tuple[LocalStore, Version]) -> None:
    local, v = version
    sink, progress = CountingSink(), Recorder()
    out = push(sink, local, v, progress=progress)
    assert sink.calls == ["blobs", "existing", "sending abcd", "sizes abcd", "damaged ad", "blob b", "blob c",
                          "blob d", "manifest", "sent", "signatures", "outcome"]
    assert progress.events == [("start", 9), ("advance", 1), ("advance", 1), ("advance", 1), ("done", None)]
    assert out == PushOutcome(v, "published", False, uploaded_blobs=3, uploaded_bytes=8, present_blobs=1,
                              repaired_blobs=1, resumed_bytes=1, tag="t")


def test_a_version_already_there_is_reused_and_checked_only_where_the_sink_repairs(
        version: tuple[LocalStore, Version]) -> None:
    local, v = version
    repairing = CountingSink(there=True)
    out = push(repairing, local, v)
    assert "manifest" not in repairing.calls and "blob b" in repairing.calls
    assert (out.reused, out.digest, out.uploaded_blobs) == (True, "there", 3)
    whole = CountingSink(there=True, repairs=False)
    out = push(whole, local, v)
    assert whole.calls == ["blobs", "existing", "signatures", "outcome"]
    assert (out.reused, out.uploaded_blobs, out.uploaded_bytes, out.present_blobs) == (True, 0, 0, 4)


def test_signatures_stay_behind_when_the_sink_numbers_the_version_otherwise(
        version: tuple[LocalStore, Version]) -> None:
    """A signature covers the manifest's bytes, which carry the number."""
    local, v = version
    sink = CountingSink(renumbered=True)
    out = push(sink, local, v)
    assert "signatures" not in sink.calls and out.version.number == 2 and out.signatures == 0


def test_a_push_to_oci_goes_through_the_core(version: tuple[LocalStore, Version], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`api.push` to an OCI layout drives an `OciSink` through the same core (S3: `test_s3`, which has a server)."""
    from registry import api
    from registry.store import transfer

    local, v = version
    sinks: list[str] = []
    core = transfer.push

    def spy(sink: Any, *args: Any, **kwargs: Any) -> PushOutcome:
        sinks.append(type(sink).__name__)
        return core(sink, *args, **kwargs)

    monkeypatch.setattr(transfer, "push", spy)
    out = api.push(local, v, f"oci-layout:{tmp_path / 'layout'}:v1")
    assert sinks == ["OciSink"] and out.tag == "v1" and out.uploaded_blobs > 0
