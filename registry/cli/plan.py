"""`mreg plan MATRIX.toml`: a matrix's items, their keys, what each needs, what the store has; `--emit` writes the
document a job engine runs them from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from registry import api
from registry.cli.options import (
    cache_option,
    config_option,
    endpoint_option,
    hub_endpoint_option,
    json_option,
    quiet_hub,
    settings_for,
    store_at,
)
from registry.cli.render import SCHEMA_VERSION, Output, table

ENGINES = ("github", "gitlab", "k8s-job", "argo", "json")


@click.command("plan")
@click.argument("matrix_path", metavar="MATRIX.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--emit", type=click.Choice(ENGINES),
              help="Write what a job engine runs instead of the plan: a GitHub Actions strategy.matrix (JSON for "
                   "fromJSON), GitLab parallel:matrix jobs, a Kubernetes List (the matrix as a ConfigMap and one "
                   "Indexed Job per kind of machine), an Argo Workflow, or a plain JSON work list.")
@click.option("--all", "include_existing", is_flag=True,
              help="With --emit: also the items the store already has (marked exists: true); default: only the "
                   "missing ones, so a re-run schedules only what is not done.")
@click.option("--image", default="mreg:latest", show_default=True, metavar="IMAGE",
              help="k8s-job, argo: the container image with mreg (and the converters' tools).")
@click.option("--offline", is_flag=True, help="Use only the cache for hub sources; never contact the hub.")
@hub_endpoint_option
@config_option
@cache_option
@endpoint_option
@json_option
def plan_cmd(matrix_path: Path, emit: str | None, include_existing: bool, image: str, offline: bool,
             endpoint: str | None, config_path: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Plan a conversion matrix: each item (model x target x GPU) with its conversion key, what it needs (CPU, or
    a GPU product or compute capability) and whether the store already has it.

    Keys are computed as `mreg convert` computes them, without downloading weights: a directory is
    hashed in place, a hub repository's weights are listed with their sha256 and only its small files
    are pulled. Items built on a GPU get their key there. Each item runs as
    `mreg convert --matrix MATRIX.toml --item N`.
    """
    from registry.fanout import emit as emitters
    from registry.fanout.plan import missing

    matrix = api.load_matrix(matrix_path)
    cache = settings_for(config_path, cache_dir).require_cache()
    quiet_hub(True)
    planned = api.plan_matrix(matrix, store=store_at(matrix.store), cache=cache, offline=offline, endpoint=endpoint)
    todo = planned if include_existing else missing(planned)
    if emit in ("k8s-job", "argo"):
        local = [p for p in (matrix.store, *(i.source for i in matrix.items)) if p.startswith("/")]
        if local:
            Output(False).warn(f"{local[0]} is a path on this machine; in a pod it must be a volume every pod "
                               "mounts at the same path (an s3:// store and hub sources need none)")
    if emit is not None:
        shown = str(matrix_path)
        name = matrix_path.stem
        doc = {
            "github": lambda: emitters.github(todo),
            "gitlab": lambda: emitters.gitlab(todo, shown),
            "k8s-job": lambda: emitters.kubernetes(todo, matrix.text, name, image),
            "argo": lambda: emitters.argo(todo, matrix.text, name, image),
            "json": lambda: {"schema_version": SCHEMA_VERSION, **emitters.worklist(todo, shown, matrix.store)},
        }[emit]()
        sys.stdout.write(json.dumps(doc, indent=None if emit == "github" else 2) + "\n")
        sys.stdout.flush()
        return
    items = [{"item": p.item.index, "id": p.item.id, "name": p.item.name, "source": p.item.source,
              "commit": p.commit, "target": p.item.target,
              "needs": {"kind": p.item.need.kind, "gpu_product": p.item.need.product,
                        "compute_capability": p.item.need.compute_capability},
              "key": p.key, "key_note": p.key_note, "exists": p.exists, "version": p.version} for p in planned]
    doc = {"matrix": str(matrix_path), "store": matrix.store, "items": items,
           "missing": [p.item.index for p in missing(planned)]}

    def human() -> str:
        rows = [[str(p.item.index), p.item.name, p.item.target, p.item.need.label,
                 (p.key or "on the GPU")[:16], "yes" if p.exists else "?" if p.exists is None else "no",
                 f"@{p.version}" if p.version else ""] for p in planned]
        done = sum(1 for p in planned if p.exists)
        return "\n".join([f"{matrix_path}: {len(planned)} items, {done} in {matrix.store}, "
                          f"{len(planned) - done} to run",
                          table(rows, ["item", "name", "target", "needs", "key", "exists", "version"])])

    Output(as_json).result(doc, human)
