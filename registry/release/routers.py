"""What each router needs for a rollout's current step (`mreg rollout render --target T`), from the rollout record.

mreg decides and records; a router applies. Every target is a pure function of the rollout's state, so that the
apply command (or a GitOps commit) can hand it on as it is. Kubernetes targets name the stable backend after the
alias (`<name>-<alias>`) and the canary after the canary alias (`<name>-<alias>-canary`), as DNS-1123 names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from manifests import RolloutRecord
from registry import layout
from registry.errors import UsageError
from registry.release.probes import parse_gate
from registry.store.protocol import Store

#: Rendered as YAML documents (Kubernetes resources) or as text (router configuration).
TARGETS = ("gateway-api", "inference-extension", "kserve", "argo-rollouts", "flagger", "seldon", "haproxy", "nginx",
           "llama-cpp", "triton", "json")


def state(store: Store, rec: RolloutRecord) -> dict[str, Any]:
    """The rollout's state as the apply command's standard input and `render --target json` give it."""
    canary = layout.canary_alias(rec.alias)
    return {"schema_version": 1, "name": rec.name, "alias": rec.alias, "state": rec.state, "step": rec.step,
            "steps": list(rec.steps), "weight": rec.weight,
            "stable": {"version": rec.stable, "alias": rec.alias, "path": store.alias_mount(rec.name, rec.alias),
                       "weight": 100 - rec.weight},
            "canary": {"version": rec.canary, "alias": canary, "path": store.alias_mount(rec.name, canary),
                       "weight": rec.weight}}


def dns_name(*parts: str) -> str:
    """A Kubernetes object name (DNS-1123 label) made from a model name and an alias."""
    text = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return text[:63].rstrip("-") or "mreg"


def _weights(rec: RolloutRecord) -> tuple[int, int]:
    """(stable, canary): after the last step both names serve the new version and the canary's share is 100."""
    return 100 - rec.weight, rec.weight


def _prom_gates(rec: RolloutRecord) -> list[Any]:
    return [g for g in (parse_gate(t) for t in rec.gates) if g.kind == "prom"]


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds >= 1 else "1s"


def gateway_api(rec: RolloutRecord, port: int) -> list[dict[str, Any]]:
    """Gateway API HTTPRoute: one rule, two backendRefs weighted by the canary's share."""
    stable, canary = _weights(rec)
    return [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": dns_name(rec.name, rec.alias), "labels": _labels(rec)},
             "spec": {"parentRefs": [{"name": "mreg-gateway"}],
                      "rules": [{"backendRefs": [
                          {"name": dns_name(rec.name, rec.alias), "port": port, "weight": stable},
                          {"name": dns_name(rec.name, layout.canary_alias(rec.alias)), "port": port,
                           "weight": canary}]}]}}]


def inference_extension(rec: RolloutRecord, _port: int) -> list[dict[str, Any]]:
    """Gateway API Inference Extension (alpha): a model name rewritten to the two versions by weight."""
    stable, canary = _weights(rec)
    return [{"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
             "metadata": {"name": dns_name(rec.name, rec.alias),
                          "labels": {**_labels(rec), "mreg.dev/stability": "alpha"}},
             "spec": {"rules": [{"matches": [{"model": {"value": rec.name}}],
                                 "targets": [{"modelRewrite": f"{rec.name}-{rec.stable}", "weight": stable},
                                             {"modelRewrite": f"{rec.name}-{rec.canary}", "weight": canary}]}]}}]


def kserve(rec: RolloutRecord, _port: int) -> list[dict[str, Any]]:
    """KServe InferenceService: the predictor on the canary's path with canaryTrafficPercent (KServe keeps the
    previous revision, the stable one, for the rest); after the last step, the alias's path with no canary."""
    over = rec.state not in ("running", "paused")
    path = rec.alias if over else layout.canary_alias(rec.alias)
    predictor: dict[str, Any] = {"model": {"modelFormat": {"name": "huggingface"},
                                           "storageUri": f"pvc://mreg-store/models/{rec.name}/{path}"}}
    if not over:
        predictor["canaryTrafficPercent"] = rec.weight
    return [{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
             "metadata": {"name": dns_name(rec.name), "labels": _labels(rec)}, "spec": {"predictor": predictor}}]


def argo_rollouts(rec: RolloutRecord, _port: int) -> list[dict[str, Any]]:
    """Argo Rollouts: setWeight/pause steps from the rollout's steps, analysis from its Prometheus gates."""
    steps: list[dict[str, Any]] = []
    for w in rec.steps[:-1]:
        steps += [{"setWeight": w}, {"pause": {"duration": _duration(rec.interval_s)}}]
    template = dns_name(rec.name, rec.alias, "gates")
    canary: dict[str, Any] = {"canaryService": dns_name(rec.name, layout.canary_alias(rec.alias)),
                              "stableService": dns_name(rec.name, rec.alias), "steps": steps}
    docs: list[dict[str, Any]] = []
    gates = _prom_gates(rec)
    if gates:
        canary["analysis"] = {"templates": [{"templateName": template}], "startingStep": 1}
        docs.append({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
                     "metadata": {"name": template, "labels": _labels(rec)},
                     "spec": {"metrics": [{
                         "name": f"gate-{i}", "interval": _duration(g.hold_s or 30), "failureLimit": 0,
                         "successCondition": f"result[0] {g.op} {g.threshold:g}",
                         "provider": {"prometheus": {"address": g.url, "query": g.query}}}
                         for i, g in enumerate(gates)]}})
    docs.insert(0, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                    "metadata": {"name": dns_name(rec.name, rec.alias), "labels": _labels(rec)},
                    "spec": {"strategy": {"canary": canary}}})
    return docs


def flagger(rec: RolloutRecord, port: int) -> list[dict[str, Any]]:
    """Flagger Canary: stepWeights from the rollout's steps, metrics from its Prometheus gates (MetricTemplates)."""
    gates = _prom_gates(rec)
    templates: list[dict[str, Any]] = [{"apiVersion": "flagger.app/v1beta1", "kind": "MetricTemplate",
                  "metadata": {"name": dns_name(rec.name, rec.alias, f"gate-{i}"), "labels": _labels(rec)},
                  "spec": {"provider": {"type": "prometheus", "address": g.url}, "query": g.query}}
                 for i, g in enumerate(gates)]
    metrics = []
    for t, g in zip(templates, gates, strict=True):
        bound = {"max": g.threshold} if g.op in ("<", "<=") else {"min": g.threshold}
        metrics.append({"name": t["metadata"]["name"], "templateRef": {"name": t["metadata"]["name"]},
                        "thresholdRange": bound, "interval": _duration(g.hold_s or 60)})
    canary = {"apiVersion": "flagger.app/v1beta1", "kind": "Canary",
              "metadata": {"name": dns_name(rec.name, rec.alias), "labels": _labels(rec)},
              "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": dns_name(rec.name, rec.alias)},
                       "service": {"port": port},
                       "analysis": {"interval": _duration(rec.interval_s), "threshold": 1,
                                    "stepWeights": list(rec.steps[:-1]), "metrics": metrics}}}
    return [canary, *templates]


def seldon(rec: RolloutRecord, _port: int) -> list[dict[str, Any]]:
    """Seldon Core 2 Experiment: the two versions' Models with weights, the stable one the default."""
    stable, canary = _weights(rec)
    return [{"apiVersion": "mlops.seldon.io/v1alpha1", "kind": "Experiment",
             "metadata": {"name": dns_name(rec.name, rec.alias), "labels": _labels(rec)},
             "spec": {"default": dns_name(rec.name, rec.alias),
                      "candidates": [{"name": dns_name(rec.name, rec.alias), "weight": stable},
                                     {"name": dns_name(rec.name, layout.canary_alias(rec.alias)),
                                      "weight": canary}]}}]


def _labels(rec: RolloutRecord) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "mreg", "mreg.dev/stable-version": str(rec.stable),
            "mreg.dev/canary-version": str(rec.canary)}


def haproxy(rec: RolloutRecord, stable_addr: str, canary_addr: str) -> str:
    """An HAProxy backend with two weighted servers, and the runtime API commands that set the same weights."""
    stable, canary = _weights(rec)
    be = dns_name(rec.name, rec.alias).replace("-", "_")
    return (f"# mreg rollout of {rec.name} {rec.alias}: {rec.stable} at {stable}%, {rec.canary} at {canary}%\n"
            f"# runtime API: set weight {be}/stable {stable}; set weight {be}/canary {canary}\n"
            f"backend {be}\n    balance roundrobin\n"
            f"    server stable {stable_addr} weight {stable} check\n"
            f"    server canary {canary_addr} weight {canary} check\n")


def nginx(rec: RolloutRecord, stable_addr: str, canary_addr: str) -> str:
    """nginx: weighted upstream servers (split_clients for sticky shares by request id)."""
    stable, canary = _weights(rec)
    up = dns_name(rec.name, rec.alias).replace("-", "_")
    lines = [f"# mreg rollout of {rec.name} {rec.alias}: {rec.stable} at {stable}%, {rec.canary} at {canary}%",
             f"upstream {up}_stable {{ server {stable_addr}; }}", f"upstream {up}_canary {{ server {canary_addr}; }}",
             f"split_clients \"${{request_id}}\" ${up}_backend {{"]
    if canary:
        lines.append(f"    {canary}% {up}_canary;")
    lines += [f"    * {up}_stable;" if stable else f"    * {up}_canary;", "}",
              f"# in the server block: location / {{ proxy_pass http://${up}_backend; }}"]
    return "\n".join(lines) + "\n"


def engine_note(engine: str) -> Callable[[RolloutRecord, Store], dict[str, Any]]:
    """llama.cpp and Triton serve versions; they split no traffic between them (a router in front does)."""
    def note(rec: RolloutRecord, store: Store) -> dict[str, Any]:
        doc = state(store, rec)
        if engine == "llama-cpp":
            doc["splits_traffic"] = False
            doc["note"] = ("llama.cpp's server serves one model per process and splits no traffic: run one server "
                           "on each path (stable and canary) and put a router in front (--target haproxy, nginx, "
                           "gateway-api)")
        else:
            doc["splits_traffic"] = False
            doc["version_policy"] = {"specific": {"versions": sorted({rec.stable, rec.canary})}}
            doc["note"] = ("Triton serves both versions side by side (version_policy specific) and splits no "
                           "traffic: clients or a router choose the version per request")
        return doc
    return note


def render(store: Store, rec: RolloutRecord, target: str, *, port: int = 8080, stable_addr: str = "stable:8080",
           canary_addr: str = "canary:8080") -> str | list[dict[str, Any]] | dict[str, Any]:
    """The router configuration for the rollout's current step: Kubernetes resources (a list), a document, or text."""
    k8s = {"gateway-api": gateway_api, "inference-extension": inference_extension, "kserve": kserve,
           "argo-rollouts": argo_rollouts, "flagger": flagger, "seldon": seldon}
    if target in k8s:
        return k8s[target](rec, port)
    if target == "haproxy":
        return haproxy(rec, stable_addr, canary_addr)
    if target == "nginx":
        return nginx(rec, stable_addr, canary_addr)
    if target in ("llama-cpp", "triton"):
        return engine_note(target)(rec, store)
    if target == "json":
        return state(store, rec)
    raise UsageError(f"unknown render target {target[:40]!r}", hint=f"known: {', '.join(TARGETS)}")
