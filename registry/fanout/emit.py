"""The documents job engines run a matrix from (pure: planned items in, JSON-ready dicts out).

Each item runs as `mreg convert --matrix M.toml --item N`. An engine that gives each task its own
variables (GitHub Actions, GitLab CI, Argo) passes N; a Kubernetes Indexed Job has only its
completion index, so each Job lists the items it runs and `--among` maps the index to one. GPU items
go where their GPU is: a nodeSelector on the NVIDIA GPU operator's labels and a GPU request
(Kubernetes, Argo), a `gpu` field to pick runners by (GitHub, GitLab tags). Failures are retried or
not by the exit code, as `registry.errors.RETRYABLE` splits them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from typing import Any

from registry.errors import EXIT_CODES, RETRYABLE
from registry.fanout.matrix import Need
from registry.fanout.plan import PlannedItem

#: Exit codes that fail an item at once: the same inputs fail the same way (see RETRYABLE for the others).
PERMANENT: tuple[int, ...] = tuple(sorted(c for c in EXIT_CODES if c not in RETRYABLE and c != 0))
#: Where the matrix is in a pod (a ConfigMap volume for Kubernetes, a raw artifact for Argo) and the cache beside it.
POD_MATRIX_DIR = "/etc/mreg"
POD_MATRIX = f"{POD_MATRIX_DIR}/matrix.toml"
POD_CACHE = "/var/cache/mreg"
#: A Secret whose keys become the pod's environment (AWS_* for an S3 store, HF_TOKEN), optional.
STORE_SECRET = "mreg-store"
GPU_RESOURCE = "nvidia.com/gpu"
#: Retries of one item before the engine gives it up (each is a fresh pod or runner).
RETRIES = 2
#: GitLab runs at most this many jobs from one parallel:matrix.
GITLAB_MAX = 200
#: How a GitLab job's script names its item (the shell expands it; every other word is quoted).
ITEM_VAR = '"$MREG_ITEM"'


def convert_argv(matrix_path: str, item: str, among: str | None = None) -> list[str]:
    """The command every emitted task runs."""
    return ["mreg", "convert", "--matrix", matrix_path, "--item", item, *(["--among", among] if among else []),
            "--json"]


def worklist(items: Sequence[PlannedItem], matrix_path: str, store: str) -> dict[str, Any]:
    """`--emit json`: engine-neutral, one entry per item to run with its command."""
    return {"store": store, "matrix": matrix_path, "retryable_exit_codes": sorted(RETRYABLE),
            "items": [{**_fields(p), "argv": convert_argv(matrix_path, str(p.item.index))} for p in items]}


def github(items: Sequence[PlannedItem]) -> dict[str, Any]:
    """A `strategy.matrix` for `fromJSON`: one `include` entry per item (`gpu` empty for CPU items)."""
    return {"include": [{**_fields(p), "gpu": "" if p.item.need.kind == "cpu" else p.item.need.label}
                        for p in items]}


def gitlab(items: Sequence[PlannedItem], matrix_path: str) -> dict[str, Any]:
    """Jobs with `parallel:matrix` (CPU items, and GPU items with runner tags from `MREG_GPU`), retried on the
    retryable exit codes only."""
    jobs: dict[str, Any] = {}
    script = " ".join(a if a == ITEM_VAR else shlex.quote(a) for a in convert_argv(matrix_path, ITEM_VAR))
    cpu = [p for p in items if p.item.need.kind == "cpu"]
    gpu = [p for p in items if p.item.need.kind == "gpu"]
    for label, group, tags in (("mreg-convert", cpu, None), ("mreg-convert-gpu", gpu, ["$MREG_GPU"])):
        for n in range(0, len(group), GITLAB_MAX):
            name = label if n == 0 else f"{label}-{n // GITLAB_MAX + 1}"
            jobs[name] = {
                "parallel": {"matrix": [{"MREG_ITEM": str(p.item.index), "MREG_NAME": p.item.name,
                                         "MREG_TARGET": p.item.target, "MREG_KEY": p.key or "",
                                         "MREG_GPU": "" if tags is None else p.item.need.label}
                                        for p in group[n:n + GITLAB_MAX]]},
                "script": [script],
                "retry": {"max": RETRIES, "exit_codes": sorted(RETRYABLE)},
                **({"tags": tags} if tags else {}),
            }
    return jobs


def kubernetes(items: Sequence[PlannedItem], matrix_text: str, matrix_name: str, image: str) -> dict[str, Any]:
    """A `List`: the matrix as a ConfigMap, and one Indexed Job per kind of machine (CPU, each GPU)."""
    digest = _digest(matrix_text)
    # A Job's name is also its pods' `job-name` label: at most 63 characters (30 + the class's 12 + the digest's 10).
    base = _dns(f"mreg-{matrix_name}")[:30].rstrip("-")
    config = f"{base}-{digest}"
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": config, "labels": _labels(digest)},
                                      "data": {"matrix.toml": matrix_text}}]
    for need, group in _by_need(items):
        among = ",".join(str(p.item.index) for p in group)
        container: dict[str, Any] = {
            "name": "mreg", "image": image,
            "command": convert_argv(POD_MATRIX, "$(JOB_COMPLETION_INDEX)", among),
            "env": [{"name": "MREG_CACHE_DIR", "value": POD_CACHE}],
            "envFrom": [{"secretRef": {"name": STORE_SECRET, "optional": True}}],
            "volumeMounts": [{"name": "matrix", "mountPath": POD_MATRIX_DIR, "readOnly": True},
                             {"name": "cache", "mountPath": POD_CACHE}],
        }
        pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container],
                               "volumes": [{"name": "matrix", "configMap": {"name": config}},
                                           {"name": "cache", "emptyDir": {}}]}
        if need.kind == "gpu":
            container["resources"] = {"limits": {GPU_RESOURCE: "1"}}
            pod["nodeSelector"] = _node_selector(need)
        objects.append({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{base}-{_dns(need.label)[:12].rstrip('-')}-{digest}", "labels": _labels(digest)},
            "spec": {
                "completionMode": "Indexed", "completions": len(group), "parallelism": len(group),
                "backoffLimitPerIndex": RETRIES,
                "podFailurePolicy": {"rules": [
                    # The same inputs fail the same way: fail this index now, spend no retries on it.
                    {"action": "FailIndex", "onExitCodes": {"containerName": "mreg", "operator": "In",
                                                            "values": list(PERMANENT)}},
                    # A pod evicted or preempted did not fail: run it again without counting it.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]},
                "template": {"metadata": {"labels": _labels(digest)}, "spec": pod},
            },
        })
    return {"apiVersion": "v1", "kind": "List", "items": objects}


def argo(items: Sequence[PlannedItem], matrix_text: str, matrix_name: str, image: str) -> dict[str, Any]:
    """A Workflow: one step per item, all in parallel, memoized by its conversion key, retried on retryable codes."""
    templates: list[dict[str, Any]] = []
    steps: list[tuple[int, dict[str, Any]]] = []
    for need, group in _by_need(items):
        name = f"convert-{_dns(need.label)[:40].rstrip('-')}"
        template: dict[str, Any] = {
            "name": name,
            "inputs": {"parameters": [{"name": "item"}, {"name": "key"}],
                       "artifacts": [{"name": "matrix", "path": POD_MATRIX, "raw": {"data": matrix_text}}]},
            # The conversion key names the work: a workflow re-run skips items whose key already succeeded.
            "memoize": {"key": "{{inputs.parameters.key}}", "maxAge": "8760h",
                        "cache": {"configMap": {"name": "mreg-conversions"}}},
            "retryStrategy": {"limit": str(RETRIES), "retryPolicy": "Always",
                              "expression": f"!(asInt(lastRetry.exitCode) in {list(PERMANENT)})"},
            "container": {"image": image, "command": convert_argv(POD_MATRIX, "{{inputs.parameters.item}}"),
                          "env": [{"name": "MREG_CACHE_DIR", "value": POD_CACHE}],
                          "envFrom": [{"secretRef": {"name": STORE_SECRET, "optional": True}}]},
        }
        if need.kind == "gpu":
            template["container"]["resources"] = {"limits": {GPU_RESOURCE: "1"}}
            template["nodeSelector"] = _node_selector(need)
        templates.append(template)
        steps += [(p.item.index, {"name": f"item-{p.item.index}", "template": name,
                                  "arguments": {"parameters": [{"name": "item", "value": str(p.item.index)},
                                                               {"name": "key", "value": _memo_key(p)}]}})
                  for p in group]
    ordered = [step for _, step in sorted(steps, key=lambda s: s[0])]  # in the matrix's order, whatever the machine
    main: dict[str, Any] = {"name": "matrix", "steps": [ordered] if ordered else []}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": f"{_dns(f'mreg-{matrix_name}')[:40].rstrip('-')}-",
                         "labels": _labels(_digest(matrix_text))},
            "spec": {"entrypoint": "matrix", "templates": [main, *templates]}}


def _fields(p: PlannedItem) -> dict[str, Any]:
    return {"item": p.item.index, "id": p.item.id, "name": p.item.name, "target": p.item.target,
            "key": p.key, "needs": p.item.need.label, "exists": p.exists}


def _by_need(items: Sequence[PlannedItem]) -> list[tuple[Need, list[PlannedItem]]]:
    groups: dict[Need, list[PlannedItem]] = {}
    for p in items:
        groups.setdefault(p.item.need, []).append(p)
    return sorted(groups.items(), key=lambda kv: (kv[0].kind != "cpu", kv[0].label))


def _node_selector(need: Need) -> dict[str, str]:
    """The NVIDIA GPU operator's node labels for a GPU product or a compute capability (any GPU: none)."""
    if need.product:
        return {"nvidia.com/gpu.product": need.product}
    if need.compute_capability:
        digits = need.compute_capability.replace("sm_", "").replace("sm", "").replace(".", "")
        return {"nvidia.com/gpu.compute.major": digits[:-1], "nvidia.com/gpu.compute.minor": digits[-1]}
    return {"nvidia.com/gpu.present": "true"}


def _memo_key(p: PlannedItem) -> str:
    """A ConfigMap key: the conversion key, or (known only on the GPU) the item's identity and source commit."""
    if p.key:
        return f"mreg-{p.key}"
    ident = f"{p.item.name}\0{p.item.target}\0{p.item.need.label}\0{p.commit}"
    return f"mreg-item-{hashlib.sha256(ident.encode()).hexdigest()}"


def _labels(digest: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "mreg", "app.kubernetes.io/component": "convert", "mreg/matrix": digest}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _dns(text: str) -> str:
    """A DNS-1123 label's characters: lower case, digits and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-") or "x"
