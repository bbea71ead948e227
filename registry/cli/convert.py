"""`mreg convert`: a source into a new verified version (or the existing one made the same way)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.options import (
    WholeNumber,
    cache_option,
    config_option,
    json_option,
    local_store,
    progress_for,
    pull_options,
    quiet_hub,
    s3_store,
    settings_for,
    store_option,
)
from registry.cli.render import Output

if TYPE_CHECKING:
    from registry.convert.once import Waiting


def _tensorrt_fields(backend: str | None, target: str | None, shapes: str | None,
                     precision: str | None) -> dict[str, str]:
    """--backend/--target/--shapes/--precision as given, by the field of the TensorRT options each sets (the
    converter reads them as it reads its spec's keys)."""
    fields = {"backend": backend, "targets": target, "shapes": shapes, "precision": precision}
    return {k: v for k, v in fields.items() if v}


def _gguf_fields(budget: str | None, evaluation: str | None, eval_tokens: int | None, calibration: str | None,
                 ctx: int | None, imatrix_file: str | None) -> dict[str, Any]:
    """--budget/--evaluation/--eval-tokens/--calibration/--calibration-ctx/--imatrix as the fields of the GGUF
    options they set (a path is taken whole: it may hold a comma)."""
    fields: dict[str, Any] = {
        "budget": tuple(x.strip() for x in (budget or "").split(",") if x.strip()) or None,
        "evaluation": evaluation or None, "tokens": str(eval_tokens) if eval_tokens is not None else None,
        "calibration": calibration or None, "calibration_ctx": str(ctx) if ctx is not None else None,
        "imatrix": imatrix_file or None}
    return {k: v for k, v in fields.items() if v is not None}


def _say_waiting(w: Waiting) -> None:
    """Who this run waits for, on stderr (once per holder)."""
    import time

    if w.holder is None:
        click.echo(f"waiting: the conversion lease {w.where} is being written, or is not one mreg wrote; "
                   "it is taken over if it does not change for one lease duration", err=True)
        return
    left = max(0, round(w.holder.expires - time.time()))
    click.echo(f"waiting: {w.holder.name}'s conversion {w.holder.key[:12]}… is being done by {w.holder.holder()} "
               f"since {w.holder.since()} (lease {w.where}, expires in {left} s unless renewed)", err=True)


def _matrix_item(matrix_path: str | None, item: int | None, among: str | None, source: str | None,
                 targets: tuple[str, ...], name: str | None,
                 store: str | None) -> tuple[str, tuple[str, ...], str | None, str | None, int | None]:
    """SOURCE, --to, --name and --store as given, or (`--matrix M --item N`) as the matrix's item N says, with
    that item's number in the matrix."""
    from registry.errors import UsageError

    if matrix_path is None:
        if item is not None or among is not None:
            raise UsageError("--item and --among go with --matrix", hint="add --matrix MATRIX.toml")
        if source is None or not targets:
            raise UsageError("convert needs SOURCE and --to (or --matrix M.toml --item N)",
                             hint="e.g. mreg convert Qwen/Qwen2.5-0.5B --to hf --name qwen")
        return source, targets, name, store, None
    if item is None or source is not None or targets or name or store:
        raise UsageError("--matrix takes --item N, and no SOURCE, --to, --name or --store (the matrix names them)",
                         hint="mreg convert --matrix M.toml --item N; `mreg plan M.toml` lists the items")
    try:
        picks = [int(x) for x in among.split(",")] if among is not None else None
    except ValueError:
        raise UsageError(f"--among {among!r} is not a comma-separated list of item numbers",
                         hint="e.g. --among 0,3,7") from None
    matrix = api.load_matrix(matrix_path)
    chosen = api.matrix_item(matrix, item, picks)
    return chosen.source, (chosen.target,), chosen.name, matrix.store, chosen.index


@click.command("convert")
@click.argument("source", required=False, metavar="REPO[@REVISION] | ./DIR | NAME@REF | oci://HOST/REPO:TAG | "
                                                  "oci-layout:DIR | oci-archive:FILE.tar")
@click.option("--matrix", "matrix_path", metavar="MATRIX.toml",
              help="Run one item of a conversion matrix (with --item; see `mreg plan`): its source, target, name "
                   "and store come from the file.")
@click.option("--item", type=click.IntRange(min=0), metavar="N", help="With --matrix: the item to convert.")
@click.option("--among", metavar="I0,I1,...",
              help="With --matrix: --item N picks the Nth of these items (a Kubernetes Indexed Job's index).")
@click.option("--to", "targets", multiple=True, metavar="FORMAT[:SPEC]",
              help="Target format (repeatable): hf, gguf:TYPE (F16, Q8_0, Q4_K_M, …, auto), onnx[:fp16,int8,optimize,"
                   "with-past], tensorrt[:target=sm_86+sm_89,…].")
@click.option("--name", help="Model name in the store (default for NAME@REF sources: the same model).")
@click.option("--copy", is_flag=True,
              help="Copy, never link: a local directory into the cache, the cache's files into the store.")
@click.option("--backend", type=click.Choice(["tensorrt-rtx", "tensorrt"]), help="TensorRT: the builder.")
@click.option("--target", "trt_target", metavar="sm_86,sm_89", help="TensorRT: compute capabilities, one engine each.")
@click.option("--shapes", metavar="NAME=MIN:OPT:MAX,...", help="TensorRT: profiles, e.g. input_ids=1x1:1x128:8x2048.")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), help="TensorRT: engine precision.")
@click.option("--budget", metavar="kl=0.02[,ppl=1.02,top1=0.9,kl99=0.2]",
              help="gguf:auto: the quality the chosen type must meet on the evaluation text (default kl=0.02).")
@click.option("--evaluation", metavar="FILE|default",
              help="GGUF: measure quality on this text (default: the shipped one for every quantized type; "
                   "F16/BF16/F32 use a fixed prompt unless given).")
@click.option("--eval-tokens", type=WholeNumber(1), metavar="N",
              help="GGUF: evaluate the text's first N tokens (default 512; 128 "
                   "for a named quantized type measured without --evaluation).")
@click.option("--calibration", metavar="FILE|default",
              help="GGUF: compute an importance matrix on this text ('default': the one mreg ships), quantize with it.")
@click.option("--calibration-ctx", type=WholeNumber(1), metavar="N",
              help="GGUF: tokens per calibration chunk (default 512).")
@click.option("--imatrix", "imatrix_file", metavar="FILE",
              help="GGUF: quantize with this importance matrix made by llama-imatrix (.gguf or .dat).")
@click.option("--no-wait", is_flag=True,
              help="When another run (on any machine) is doing this same conversion, exit 5 at once instead of "
                   "waiting for its version.")
@config_option
@cache_option
@store_option
@pull_options
@json_option
def convert_cmd(source: str | None, matrix_path: str | None, item: int | None, among: str | None,
                targets: tuple[str, ...], name: str | None, copy: bool, backend: str | None,
                trt_target: str | None, shapes: str | None, precision: str | None, budget: str | None,
                evaluation: str | None, eval_tokens: int | None, calibration: str | None,
                calibration_ctx: int | None, imatrix_file: str | None, config_path: str | None,
                cache_dir: str | None, store: str | None, include: tuple[str, ...], exclude: tuple[str, ...],
                allow_pickle: bool, offline: bool, endpoint: str | None, insecure: bool, no_wait: bool,
                as_json: bool) -> None:
    """Convert a source (pulled into the cache first if needed) into a new, verified version.

    SOURCE is a hub repository, a local directory, or an existing version (NAME@REF): then the
    new version carries that version's artifacts (no copy) and adds the targets to them. The
    same conversion (same source bytes, converters, options, tool versions) run again returns
    the existing version without new work. The store may be s3://BUCKET/PREFIX: the version is built on this
    machine, then pushed. One run per conversion does the work, on any number of machines sharing the store:
    the others wait for its version (saying on stderr who they wait for), or exit 5 with --no-wait.

    With --matrix M.toml --item N, the item N of a conversion matrix (`mreg plan M.toml` lists
    them) is converted into the matrix's store: this is what each task of an emitted CI matrix,
    Kubernetes Job or Argo Workflow runs.
    """
    from registry.convert.plan import with_flags

    src, targets, name, store, index = _matrix_item(matrix_path, item, among, source, targets, name, store)
    options = with_flags(targets, "tensorrt", _tensorrt_fields(backend, trt_target, shapes, precision),
                         "--backend, --target, --shapes and --precision")
    options = with_flags(options, "gguf", _gguf_fields(budget, evaluation, eval_tokens, calibration, calibration_ctx,
                                                       imatrix_file),
                         "--budget, --evaluation, --eval-tokens, --calibration, --calibration-ctx and --imatrix")
    parsed = api.prepare_targets(options)  # bad targets or options are refused before any download, files read once
    settings = settings_for(config_path, cache_dir, store)
    location = str(settings.require_store())
    st = s3_store(location) if location.startswith("s3://") else local_store(settings)
    outcome = api.convert(src, parsed, store=st, cache=settings.require_cache(), name=name, copy=copy,
                          include=include, exclude=exclude, allow_pickle=allow_pickle, offline=offline,
                          endpoint=endpoint, progress=progress_for(as_json), on_pull=lambda: quiet_hub(as_json),
                          insecure=insecure, wait=not no_wait, on_wait=_say_waiting)
    v = outcome.version
    m = v.manifest
    doc = {
        "name": v.name, "version": v.number, "reused": outcome.reused, "path": v.path,
        "manifest_sha256": v.manifest_sha256, "key": m.key,
        "formats": [a.format for a in m.artifacts],
        "verification": {a.format: a.verification.status for a in m.artifacts},
        "not_run": {a.format: list(a.verification.unrun()) for a in m.artifacts if a.verification.unrun()},
        "source": {"repo": outcome.source.repo, "commit": outcome.source.commit},
        "duration_s": round(outcome.duration_s, 3),
        **({"item": index} if index is not None else {}),
    }
    verb = "exists" if outcome.reused else "published"
    checks = ", ".join(f"{a.format} {a.verification.status}" for a in m.artifacts)
    Output(as_json).result(doc, lambda: "\n".join([
        f"✓ {v.name}@{v.number} {verb} ({', '.join(a.format for a in m.artifacts)}; verification {checks})",
        # What the verification could not do here, in plain words (a GGUF that llama.cpp never loaded).
        *[f"  not run  {a.format}: {line}" for a in m.artifacts for line in a.verification.unrun()],
        f"  path     {v.path}",
        f"  manifest sha256:{v.manifest_sha256[:16]}",
    ]))
