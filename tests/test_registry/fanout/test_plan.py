"""`mreg plan`: keys as `mreg convert` computes them, the emitted documents loaded by each engine's own models, and a
matrix run item by item in separate processes against one store, twice (the second run converts nothing)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok, run
from support.hub_server import LocalHub
from support.matrix_driver import run_matrix
from support.s3_server import running
from support.tiny_models import build_tiny_llama

from registry.errors import RETRYABLE
from registry.fanout.emit import PERMANENT

TARGETS = ["hf", "gguf:F16"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny llamas with different weights."""
    root = tmp_path_factory.mktemp("fanout-sources")
    return [build_tiny_llama(root / f"tiny{i}", seed=i) for i in range(2)]


def _matrix(path: Path, store: Path, sources: list[Path], targets: list[str], extra: str = "") -> Path:
    lines = [f'store = "{store}"']
    for i, src in enumerate(sources):
        lines += ["[[models]]", f'name = "m{i}"', f'source = "{src}"', f"targets = {json.dumps(targets)}", extra]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_a_matrix_runs_item_by_item_and_a_second_run_converts_nothing(isolated: Path, sources: list[Path]) -> None:
    store = isolated / "shared-store"
    matrix = _matrix(isolated / "m.toml", store, sources, TARGETS)
    planned = ok(run("plan", matrix, "--json"))
    assert [(i["item"], i["name"], i["target"], i["exists"]) for i in planned["items"]] == [
        (0, "m0", "hf", False), (1, "m0", "gguf:F16", False), (2, "m1", "hf", False), (3, "m1", "gguf:F16", False)]
    assert all(i["needs"]["kind"] == "cpu" and len(i["key"]) == 64 for i in planned["items"])
    gh = run("plan", matrix, "--emit", "github")
    include = json.loads(gh.stdout)["include"]
    assert [e["item"] for e in include] == [0, 1, 2, 3] and all(e["gpu"] == "" for e in include)

    first, _ = run_matrix(matrix, include, workers=2)
    assert [d["exit_code"] for d in first] == [0] * 4, [d["stderr"] for d in first]
    assert [d["reused"] for d in first] == [False] * 4
    # The key each process computed with the whole source is the one the plan computed without converting.
    assert [d["key"] for d in first] == [i["key"] for i in planned["items"]]
    assert [d["item"] for d in first] == [0, 1, 2, 3]

    again, _ = run_matrix(matrix, include, workers=2)  # the same CI matrix re-run: all found, nothing converted
    assert [(d["exit_code"], d["reused"], d["version"]) for d in again] == [
        (0, True, d["version"]) for d in first]
    replanned = ok(run("plan", matrix, "--json"))
    assert replanned["missing"] == [] and all(i["exists"] for i in replanned["items"])
    assert json.loads(run("plan", matrix, "--emit", "github").stdout) == {"include": []}
    assert ok(run("verify", "--all", "--store", store, "--json"))


def test_a_hub_source_is_keyed_without_downloading_its_weights(isolated: Path, sources: list[Path]) -> None:
    with LocalHub() as hub:
        files = {p.name: p for p in sources[0].iterdir() if p.is_file()}
        hub.add_commit("org/tiny", files)
        matrix = isolated / "hub.toml"
        matrix.write_text(f'store = "{isolated / "store"}"\n[[models]]\nname = "t"\nsource = "org/tiny@main"\n'
                          'targets = ["hf"]\n')
        hub.reset_counters()
        planned = ok(run("plan", matrix, "--endpoint", hub.endpoint, "--json"))
        fetched = [path for _method, path, _headers in hub.requests if "/resolve/" in path]
        assert fetched and not any(p.endswith(".safetensors") for p in fetched), fetched
        (item,) = planned["items"]
        # Offline, the cache holds only the small files: the weights' digests are unknown, so is the key.
        assert run("plan", matrix, "--offline", "--json").exit_code == 3
        made = ok(run("convert", "--matrix", matrix, "--item", "0", "--endpoint", hub.endpoint, "--json"))
        assert made["key"] == item["key"] and made["source"]["commit"] == item["commit"]
    (offline,) = ok(run("plan", matrix, "--offline", "--json"))["items"]  # the hub is gone; the pull is cached
    assert (offline["key"], offline["exists"], offline["version"]) == (item["key"], True, made["version"])


@pytest.mark.slow
def test_an_s3_store_says_what_it_has(isolated: Path, sources: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Runners that share only a bucket: the plan finds pushed versions through the store's key index."""
    with running(isolated / "seaweed", "mreg-plan") as server:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        remote = "s3://mreg-plan/registry"
        matrix = _matrix(isolated / "s3.toml", Path("unused"), sources[:1], TARGETS)
        matrix.write_text(matrix.read_text().replace('store = "unused"', f'store = "{remote}"'))
        assert ok(run("plan", matrix, "--json"))["missing"] == [0, 1]  # an empty bucket prefix: nothing yet
        made = ok(run("convert", sources[0], "--to", "hf", "--name", "m0", "--json"))
        ok(run("push", f"m0@{made['version']}", remote, "--json"))
        items = ok(run("plan", matrix, "--json"))["items"]
        assert [(i["exists"], i["version"]) for i in items] == [(True, 1), (False, None)]
        assert items[0]["key"] == made["key"]
        include = json.loads(run("plan", matrix, "--emit", "github").stdout)["include"]
        assert [e["item"] for e in include] == [1]
        # Runners that share only the bucket: each item converts straight into it, and a re-run converts nothing.
        whole = json.loads(run("plan", matrix, "--emit", "github", "--all").stdout)["include"]
        first, _ = run_matrix(matrix, whole, workers=2)
        assert [(d["exit_code"], d["reused"]) for d in first] == [(0, True), (0, False)], [d["stderr"] for d in first]
        again, _ = run_matrix(matrix, whole, workers=2)
        assert [(d["exit_code"], d["reused"], d["version"]) for d in again] == [
            (0, True, d["version"]) for d in first]
        assert ok(run("plan", matrix, "--json"))["missing"] == []
        assert json.loads(run("plan", matrix, "--emit", "github").stdout) == {"include": []}


def _gpu_matrix(isolated: Path, sources: list[Path]) -> Path:
    return _matrix(isolated / "gpu.toml", isolated / "store", sources[:1], ["hf", "tensorrt:precision=fp16"],
                   'gpus = ["NVIDIA-H100-80GB-HBM3", "sm_89"]')


def test_tensorrt_items_per_gpu(isolated: Path, sources: list[Path]) -> None:
    items = ok(run("plan", _gpu_matrix(isolated, sources), "--json"))["items"]
    assert [(i["target"], i["needs"]["kind"], i["needs"]["gpu_product"]) for i in items] == [
        ("hf", "cpu", None),
        ("tensorrt:precision=fp16,backend=tensorrt", "gpu", "NVIDIA-H100-80GB-HBM3"),
        ("tensorrt:precision=fp16,target=sm_89", "cpu", None)]
    # Built on the GPU: its compute capability is an input, so its key is known there, and it is always scheduled.
    assert items[1]["key"] is None and items[1]["exists"] is None and items[2]["key"]


def _job_dicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    return [o for o in doc["items"] if o["kind"] == "Job"]


def test_kubernetes_jobs_load_as_v1job(isolated: Path, sources: list[Path]) -> None:
    from kubernetes.client import ApiClient

    class Response:
        def __init__(self, doc: dict[str, Any]) -> None:
            self.data = json.dumps(doc)

    long_name = isolated / ("Conversions_for_" + "x" * 70 + ".toml")  # Job names must stay DNS labels
    long_name.write_text(_gpu_matrix(isolated, sources).read_text())
    out = run("plan", long_name, "--emit", "k8s-job", "--image", "example/mreg:1")
    assert out.exit_code == 0, out.stderr
    assert out.stderr.startswith("warning: ") and "volume" in out.stderr  # a local store means nothing in a pod
    doc = json.loads(out.stdout)
    client = ApiClient()
    (config,) = [o for o in doc["items"] if o["kind"] == "ConfigMap"]
    cm = client.deserialize(Response(config), "V1ConfigMap")
    assert "[[models]]" in cm.data["matrix.toml"]
    jobs = []
    for raw in _job_dicts(doc):
        job = client.deserialize(Response(raw), "V1Job")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", job.metadata.name), job.metadata.name
        # Every field was one the model knows (an unknown one would be dropped and the round trip would differ).
        assert client.sanitize_for_serialization(job) == raw
        jobs.append(job)
    cpu, gpu = jobs
    for job, among in ((cpu, "0,2"), (gpu, "1")):
        spec = job.spec
        assert spec.completion_mode == "Indexed" and spec.completions == len(among.split(","))
        assert spec.backoff_limit_per_index >= 1
        fail, ignore = spec.pod_failure_policy.rules
        assert fail.action == "FailIndex" and fail.on_exit_codes.operator == "In"
        assert set(fail.on_exit_codes.values) == set(PERMANENT) and not set(PERMANENT) & RETRYABLE
        assert {4, 6, 8, 2}.issubset(fail.on_exit_codes.values) and 0 not in fail.on_exit_codes.values
        assert ignore.action == "Ignore" and ignore.on_pod_conditions[0].type == "DisruptionTarget"
        container = spec.template.spec.containers[0]
        assert container.command[-5:] == ["--item", "$(JOB_COMPLETION_INDEX)", "--among", among, "--json"]
        assert spec.template.spec.restart_policy == "Never"
    assert cpu.spec.template.spec.node_selector is None
    assert gpu.spec.template.spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert gpu.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}


def test_argo_workflow_loads_as_hera_model(isolated: Path, sources: list[Path]) -> None:
    from hera.workflows.models import Workflow

    out = run("plan", _gpu_matrix(isolated, sources), "--emit", "argo")
    assert out.exit_code == 0, out.stderr
    raw = json.loads(out.stdout)
    wf = Workflow.model_validate(raw)
    assert wf.model_dump(mode="json", by_alias=True, exclude_none=True) == raw  # nothing it does not know
    main, *convert = wf.spec.templates
    assert wf.spec.entrypoint == main.name
    (parallel,) = main.steps
    planned = ok(run("plan", _gpu_matrix(isolated, sources), "--json"))["items"]
    assert [s.name for s in parallel.root] == [f"item-{i['item']}" for i in planned if not i["exists"]]
    keys = {s.arguments.parameters[0].value: s.arguments.parameters[1].value for s in parallel.root}
    assert keys["0"] == f"mreg-{planned[0]['key']}" and keys["1"].startswith("mreg-item-")
    for t in convert:
        assert t.memoize.key == "{{inputs.parameters.key}}"
        assert "lastRetry.exitCode" in t.retry_strategy.expression
    gpu = next(t for t in convert if t.node_selector)
    assert gpu.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_gitlab_and_json_work_lists(isolated: Path, sources: list[Path]) -> None:
    matrix = _gpu_matrix(isolated, sources)
    jobs = json.loads(run("plan", matrix, "--emit", "gitlab").stdout)
    assert [e["MREG_ITEM"] for e in jobs["mreg-convert"]["parallel"]["matrix"]] == ["0", "2"]
    assert jobs["mreg-convert-gpu"]["tags"] == ["$MREG_GPU"]
    assert jobs["mreg-convert"]["retry"]["exit_codes"] == sorted(RETRYABLE)
    assert jobs["mreg-convert"]["script"] == [f'mreg convert --matrix {matrix} --item "$MREG_ITEM" --json']
    work = json.loads(run("plan", matrix, "--emit", "json").stdout)
    assert work["schema_version"] == 1
    assert work["items"][0]["argv"] == ["mreg", "convert", "--matrix", str(matrix), "--item", "0", "--json"]


def test_old_manifests_without_a_build_machine_still_read(isolated: Path, sources: list[Path]) -> None:
    from manifests import Manifest

    made = ok(run("convert", sources[0], "--to", "hf", "--name", "m", "--json"))
    path = Path(made["path"]) / "manifest.json"
    doc = json.loads(path.read_text())
    machine = doc["artifacts"][0]["built_on"]
    assert machine["host"] and machine["mreg_version"] and isinstance(machine["cpu_flags"], list)
    del doc["artifacts"][0]["built_on"]
    assert Manifest.model_validate(doc).artifacts[0].built_on is None
    shown = run("show", "m@1")
    assert f"built on {machine['host']}" in shown.stdout
