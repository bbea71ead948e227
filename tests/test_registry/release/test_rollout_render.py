"""`mreg rollout render`: each router's configuration for the current step, checked against the resources'
documented field names, the `kubernetes` client's models where they cover them (object metadata), and HAProxy's
own parser (`haproxy -c`) where it is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import ok

GATE = 'prom:http://prometheus:9090|sum(rate(errors{server="canary"}[1m]))|<0.05|for=30s'

#: Field names from each project's published reference (Gateway API v1 HTTPRoute, KServe v1beta1, Argo Rollouts,
#: Flagger, Seldon Core 2): a rendered resource may use only these.
FIELDS: dict[str, set[str]] = {
    "HTTPRoute.spec": {"parentRefs", "hostnames", "rules"},
    "HTTPRoute.rule": {"name", "matches", "filters", "backendRefs", "timeouts", "retry", "sessionPersistence"},
    "HTTPRoute.backendRef": {"group", "kind", "name", "namespace", "port", "weight", "filters"},
    "InferenceService.predictor": {"canaryTrafficPercent", "model", "minReplicas", "maxReplicas", "serviceAccountName"},
    "InferenceService.model": {"modelFormat", "storageUri", "runtime", "protocolVersion", "args", "env"},
    "Rollout.canary": {"canaryService", "stableService", "steps", "analysis", "trafficRouting", "maxSurge",
                       "maxUnavailable"},
    "Rollout.step": {"setWeight", "pause", "analysis", "experiment", "setCanaryScale", "setHeaderRoute"},
    "AnalysisTemplate.metric": {"name", "interval", "initialDelay", "count", "successCondition", "failureCondition",
                                "failureLimit", "inconclusiveLimit", "consecutiveErrorLimit", "provider"},
    "Canary.spec": {"provider", "targetRef", "autoscalerRef", "ingressRef", "service", "analysis",
                    "progressDeadlineSeconds", "skipAnalysis"},
    "Canary.analysis": {"interval", "threshold", "maxWeight", "stepWeight", "stepWeights", "stepWeightPromotion",
                        "metrics", "webhooks", "iterations", "match", "primaryReadyThreshold",
                        "canaryReadyThreshold"},
    "Canary.metric": {"name", "templateRef", "thresholdRange", "interval", "query", "templateVariables"},
    "MetricTemplate.spec": {"provider", "query"},
    "Experiment.spec": {"default", "candidates", "mirror", "resourceType"},
}


@pytest.fixture
def at_25(mreg: Any, model_dir: Path) -> None:
    for i in range(2):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        assert mreg("convert", model_dir, "--to", "hf", "--name", "Qwen2.5-7B").exit_code == 0
    ok(mreg("promote", "Qwen2.5-7B@1", "--json"))
    ok(mreg("rollout", "start", "Qwen2.5-7B@2", "--steps", "25,60,100", "--interval", "10m", "--gate", GATE,
            "--json"))
    ok(mreg("rollout", "advance", "Qwen2.5-7B", "--json"))


def _render(mreg: Any, target: str) -> Any:
    return ok(mreg("rollout", "render", "Qwen2.5-7B", "--target", target, "--stable-addr", "127.0.0.1:8001",
                   "--canary-addr", "127.0.0.1:8002", "--json"))


def _fields(obj: dict[str, Any], allowed: str) -> None:
    assert set(obj) <= FIELDS[allowed], f"{allowed}: {set(obj) - FIELDS[allowed]}"


def _metadata(doc: dict[str, Any]) -> None:
    from kubernetes.client import V1ObjectMeta

    assert set(doc["metadata"]) <= set(V1ObjectMeta.attribute_map.values())
    name = doc["metadata"]["name"]
    assert len(name) <= 63 and name == name.lower() and name.replace("-", "").isalnum(), name
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}


def test_kubernetes_targets(mreg: Any, at_25: None) -> None:
    (route,) = _render(mreg, "gateway-api")["resources"]
    _metadata(route)
    assert (route["apiVersion"], route["kind"]) == ("gateway.networking.k8s.io/v1", "HTTPRoute")
    _fields(route["spec"], "HTTPRoute.spec")
    (rule,) = route["spec"]["rules"]
    _fields(rule, "HTTPRoute.rule")
    for ref in rule["backendRefs"]:
        _fields(ref, "HTTPRoute.backendRef")
    assert [(r["name"], r["weight"]) for r in rule["backendRefs"]] == [
        ("qwen2-5-7b-production", 75), ("qwen2-5-7b-production-canary", 25)]

    (isvc,) = _render(mreg, "kserve")["resources"]
    _metadata(isvc)
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    _fields(isvc["spec"]["predictor"], "InferenceService.predictor")
    _fields(isvc["spec"]["predictor"]["model"], "InferenceService.model")
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 25

    rollout, template = _render(mreg, "argo-rollouts")["resources"]
    for d in (rollout, template):
        _metadata(d)
        assert d["apiVersion"] == "argoproj.io/v1alpha1"
    canary = rollout["spec"]["strategy"]["canary"]
    _fields(canary, "Rollout.canary")
    for step in canary["steps"]:
        _fields(step, "Rollout.step")
    assert canary["steps"] == [{"setWeight": 25}, {"pause": {"duration": "600s"}},
                               {"setWeight": 60}, {"pause": {"duration": "600s"}}]
    (metric,) = template["spec"]["metrics"]
    _fields(metric, "AnalysisTemplate.metric")
    assert metric["successCondition"] == "result[0] < 0.05"
    assert metric["provider"]["prometheus"] == {"address": "http://prometheus:9090",
                                                "query": 'sum(rate(errors{server="canary"}[1m]))'}
    assert canary["analysis"]["templates"] == [{"templateName": template["metadata"]["name"]}]

    flagger, metric_template = _render(mreg, "flagger")["resources"]
    for d in (flagger, metric_template):
        _metadata(d)
    _fields(flagger["spec"], "Canary.spec")
    _fields(flagger["spec"]["analysis"], "Canary.analysis")
    for m in flagger["spec"]["analysis"]["metrics"]:
        _fields(m, "Canary.metric")
        assert m["thresholdRange"] == {"max": 0.05}
    _fields(metric_template["spec"], "MetricTemplate.spec")
    assert flagger["spec"]["analysis"]["stepWeights"] == [25, 60]

    (exp,) = _render(mreg, "seldon")["resources"]
    _metadata(exp)
    _fields(exp["spec"], "Experiment.spec")
    assert [c["weight"] for c in exp["spec"]["candidates"]] == [75, 25]

    (rewrite,) = _render(mreg, "inference-extension")["resources"]
    assert rewrite["metadata"]["labels"]["mreg.dev/stability"] == "alpha"
    assert [t["weight"] for t in rewrite["spec"]["rules"][0]["targets"]] == [75, 25]
    text = mreg("rollout", "render", "Qwen2.5-7B", "--target", "gateway-api").stdout
    assert list(yaml.safe_load_all(text)) == [route], "without --json: the same resources as YAML"


def test_router_and_engine_targets(mreg: Any, at_25: None, tmp_path: Path) -> None:
    haproxy = _render(mreg, "haproxy")["text"]
    assert "server stable 127.0.0.1:8001 weight 75 check" in haproxy
    assert "server canary 127.0.0.1:8002 weight 25 check" in haproxy
    binary = shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy")
    if binary:  # HAProxy's own parser accepts the backend
        cfg = tmp_path / "h.cfg"
        cfg.write_text("defaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n"
                       "    timeout server 1s\nfrontend fe\n    bind 127.0.0.1:18999\n"
                       "    default_backend qwen2_5_7b_production\n" + haproxy)
        r = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
    nginx = _render(mreg, "nginx")["text"]
    assert 'split_clients "${request_id}" $qwen2_5_7b_production_backend {' in nginx
    assert "    25% qwen2_5_7b_production_canary;" in nginx and "    * qwen2_5_7b_production_stable;" in nginx
    for target in ("llama-cpp", "triton"):
        doc = _render(mreg, target)["document"]
        assert doc["splits_traffic"] is False and "splits no traffic" in doc["note"]
    assert _render(mreg, "triton")["document"]["version_policy"] == {"specific": {"versions": [1, 2]}}
    state = _render(mreg, "json")["document"]
    assert (state["stable"]["weight"], state["canary"]["weight"]) == (75, 25)
    r = mreg("rollout", "render", "Qwen2.5-7B", "--target", "istio", "--json")
    assert r.exit_code == 2 and "unknown render target" in json.loads(r.stdout)["error"]["message"]
