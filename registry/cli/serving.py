"""`mreg export triton`: views of a version for serving systems that want their own layout."""

from __future__ import annotations

from pathlib import Path

import click

from registry import api
from registry.cli.options import config_option, json_option, local_store, settings_for, store_option
from registry.cli.render import Output


@click.group("export")
def export_group() -> None:
    """Views of a version for serving systems that want their own layout."""


@export_group.command("triton")
@click.argument("ref", metavar="NAME@REF")
@click.option("--repo", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Triton model repository (keep it inside the store root so links resolve in containers).")
@click.option("--max-batch-size", default=8, show_default=True, help="Triton max_batch_size for dynamic batching.")
@click.option("--backend", "prefer", type=click.Choice(["auto", "onnx", "tensorrt"]), default="auto",
              show_default=True, help="Serve the ONNX model or the TensorRT plans (auto: plans when present).")
@config_option
@store_option
@json_option
def export_triton(ref: str, repo: Path, max_batch_size: int, prefer: str, config_path: str | None,
                  store: str | None, as_json: bool) -> None:
    """Write a Triton model repository entry for a version: links, config.pbtxt, one atomic rename.

    The version directory holds links to the ONNX model (and its data file) or to one TensorRT
    plan per compute capability (`cc_model_filenames`); config.pbtxt carries inputs, outputs and
    dims read from the ONNX graph, dynamic batching, and a version policy serving this version.
    """
    out = api.export_triton(local_store(settings_for(config_path, store=store)), ref, repo,
                            max_batch_size=max_batch_size, prefer=prefer)
    Output(as_json).result(
        {"name": out.name, "version": out.version, "platform": out.platform, "model_dir": str(out.model_dir),
         "version_dir": str(out.version_dir), "config": out.config},
        f"✓ {out.name}@{out.version} → {out.version_dir} ({out.platform})")
