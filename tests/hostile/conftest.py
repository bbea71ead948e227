"""Fixtures of the hostile-input corpus: a fresh World per case, one tiny llama, and the S3 server and hub that
some cases need (started only when such a case runs)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.hub_server import LocalHub
from support.s3_server import SeaweedS3, running
from support.tiny_models import build_tiny_llama
from support.world import BUCKET, World


@pytest.fixture(scope="session")
def llama_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny llama for the whole corpus; each case copies it."""
    return build_tiny_llama(tmp_path_factory.mktemp("hostile-template") / "tiny")


@pytest.fixture(scope="session")
def hostile_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS server for the S3 cases (started only when one runs)."""
    with running(tmp_path_factory.mktemp("hostile-seaweed"), BUCKET) as server:
        yield server


@pytest.fixture
def world(isolated: Path, llama_template: Path) -> World:
    """A fresh world per case, with precious files outside the store."""
    w = World(isolated, isolated / "store", isolated / "cache", llama_template)
    w.outside.mkdir()
    (w.outside / "precious.txt").write_text("not mreg's to touch")
    (w.outside / "model").mkdir()
    (w.outside / "model" / "weights.bin").write_bytes(random.Random(0).randbytes(1024))
    return w


@pytest.fixture
def s3_world(world: World, hostile_s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch,
             request: pytest.FixtureRequest) -> World:
    """The world with credentials for the S3 server in the environment and a fresh prefix."""
    for k, v in hostile_s3.env.items():
        monkeypatch.setenv(k, v)
    world.s3 = hostile_s3
    world.remote = f"s3://{BUCKET}/case-{random.randrange(1 << 40):x}"
    return world


@pytest.fixture
def hub_world(world: World) -> Iterator[World]:
    """The world with a local hub on 127.0.0.1."""
    with LocalHub() as hub:
        world.hub = hub
        yield world
