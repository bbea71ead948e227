"""The build machine record: GPUs, driver and CUDA read from nvidia-smi's output as the driver prints it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from registry import machine

#: What nvidia-smi 550 prints on an H100 node (the query, then the first lines of its banner).
QUERY = "NVIDIA H100 80GB HBM3, 9.0, 81559, 550.54.15\nNVIDIA H100 80GB HBM3, 9.0, 81559, 550.54.15\n"
BANNER = ("+-----------------------------------------------------------------------------------------+\n"
          "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |\n")


def test_gpus_driver_and_cuda_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "nvidia-smi"
    (tmp_path / "query.txt").write_text(QUERY)
    (tmp_path / "banner.txt").write_text(BANNER)
    exe.write_text(f'#!/bin/sh\nif [ $# -gt 0 ]; then cat {tmp_path}/query.txt; else cat {tmp_path}/banner.txt; fi\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpus, driver, cuda = machine._gpus()
    assert [(g.product, g.compute_capability, g.memory_mib) for g in gpus] == [
        ("NVIDIA H100 80GB HBM3", "sm_90", 81559)] * 2
    assert (driver, cuda) == ("550.54.15", "12.4")


def test_no_driver_records_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine._gpus() == ((), None, None)


def test_this_machine_is_recorded() -> None:
    here = machine.here()
    assert here.host and here.mreg_version and here.cpus >= 1
    assert all(f.startswith(machine.KERNEL_FLAGS) for f in here.cpu_flags)
