"""What a version costs to serve: KV-cache bytes per token from real configs, the memory plan's arithmetic, and
`mreg show --memory` end to end on a tiny converted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.tiny_models import build_tiny_llama

from manifests import Manifest
from registry.convert.kvcache import kv_cache_of
from registry.errors import NotFound, UsageError
from registry.serving.memory import GIB, largest_context, plan, sequence_bytes

#: Meta-Llama-3-8B's config.json (the fields the cache depends on).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
             "max_position_embeddings": 8192}
KIB = 1024


def test_seed_a_7b_model_with_128_kib_per_token_needs_32_gib_for_32_sequences_of_8192() -> None:
    """Issue 19's seed: Llama-3-8B caches 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes = 128 KiB per token."""
    kv = kv_cache_of(LLAMA3_8B)
    assert kv is not None and kv.bytes_per_token["f16"] == 128 * KIB
    assert 32 * sequence_bytes(kv, 8192, "f16") == 32 * GIB
    # q8_0: 34 bytes per 32 elements, q4_0: 18 per 32.
    assert kv.bytes_per_token["q8_0"] == 128 * KIB * 34 // 64 and kv.bytes_per_token["q4_0"] == 128 * KIB * 18 // 64
    # Exactly 32 GiB of cache beside 15 GiB of weights: 32 sequences, and one more byte short is 31.
    m = _manifest(kv.model_dump(), weights=15 * GIB, context=8192)
    fit = plan(m, 47, context=8192, utilization=1.0, reserve_gib=0).fits[0]
    assert (fit.cache_bytes, fit.sequences, fit.max_context) == (32 * GIB, 32, 8192)
    assert fit.max_context_fit == 32 * 8192
    assert fit.engines["vllm"] == ["--max-model-len", "8192", "--max-num-seqs", "32", "--gpu-memory-utilization",
                                   "1", "--kv-cache-dtype", "auto"]
    assert plan(m, 47 - 1 / GIB, context=8192, utilization=1.0, reserve_gib=0).fits[0].sequences == 31
    # The default overhead: 90% of the device, 1 GiB reserve.
    fit = plan(m, 80, context=8192).fits[0]
    assert fit.cache_bytes == int(80 * GIB * 0.9) - 15 * GIB - GIB and fit.sequences == fit.cache_bytes // (GIB)


@pytest.mark.parametrize(("config", "full", "window", "uncached", "per_token"), [
    # Gemma 2 9B: every other layer slides over 4096 tokens; head_dim 256.
    ({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "num_hidden_layers": 42,
      "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3584,
      "sliding_window": 4096}, 21, 21, 0, 21 * 8 * 256 * 4),
    # Gemma 3 (text config nested): five local layers to one global.
    ({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "hidden_size": 2560, "sliding_window": 1024, "sliding_window_pattern": 6}},
     2, 10, 0, 2 * 4 * 256 * 4),
    # Mistral 7B v0.1: every layer slides over 4096.
    ({"architectures": ["MistralForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096}, 0, 32, 0, 0),
    # Qwen2.5 names a window it does not use.
    ({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28, "num_attention_heads": 28,
      "num_key_value_heads": 4, "hidden_size": 3584, "sliding_window": 131072, "use_sliding_window": False,
      "max_window_layers": 28}, 28, 0, 0, 28 * 4 * 128 * 4),
    # Qwen3-Next / Qwen3.5: one full-attention layer in four, the others linear attention.
    ({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 48, "num_attention_heads": 16,
      "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048, "full_attention_interval": 4},
     12, 0, 36, 12 * 2 * 256 * 4),
    # layer_types, as transformers 4.5x writes it, wins over family rules.
    ({"architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256,
      "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]},
     1, 0, 3, 2 * 64 * 4),
    # DeepSeek-V3: MLA caches 512 + 64 elements per layer and token.
    ({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "num_attention_heads": 128,
      "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
     61, 0, 0, 61 * 576 * 2),
])
def test_layer_kinds_of_real_families(config: dict[str, Any], full: int, window: int, uncached: int,
                                      per_token: int) -> None:
    kv = kv_cache_of(config)
    assert kv is not None
    assert (kv.full_layers, kv.window_layers, kv.uncached_layers) == (full, window, uncached)
    assert kv.bytes_per_token["f16"] == per_token
    if window:
        assert kv.sliding_window and kv.window_bytes_per_token["f16"] > 0
        # Past the window a sliding layer's cache stops growing.
        w = kv.sliding_window
        assert sequence_bytes(kv, 4 * w, "f16") - sequence_bytes(kv, 2 * w, "f16") == 2 * w * per_token
        assert largest_context(kv, sequence_bytes(kv, 3 * w, "f16"), "f16") in (3 * w, 1 << 31)


def test_encoders_and_incomplete_configs_have_no_kv_cache() -> None:
    assert kv_cache_of({"architectures": ["BertModel"], "num_hidden_layers": 2, "num_attention_heads": 2}) is None
    assert kv_cache_of({"architectures": ["LlamaForCausalLM"]}) is None


def test_bad_questions_and_old_manifests_are_refused() -> None:
    kv = kv_cache_of(LLAMA3_8B)
    assert kv is not None
    m = _manifest(kv.model_dump(), weights=GIB, context=8192)
    for kw in ({"memory_gib": 0.0}, {"memory_gib": float("nan")}, {"memory_gib": 8.0, "utilization": 1.5},
               {"memory_gib": 8.0, "context": 0}, {"memory_gib": 8.0, "reserve_gib": -1.0}):
        with pytest.raises(UsageError):
            plan(m, **kw)
    with pytest.raises(NotFound, match="no KV-cache figures"):
        plan(_manifest(None, weights=GIB, context=8192), 8)
    with pytest.raises(NotFound, match="no weights' bytes"):
        plan(_manifest(kv.model_dump(), weights=None, context=8192), 8)
    # Weights larger than the device: an answer (no sequence fits), not an error.
    fit = plan(m, 0.5).fits[0]
    assert fit.sequences == 0 and fit.engines == {} and "no room" in fit.notes[0]
    # The default context is the model's, capped at 32768.
    assert plan(_manifest(kv.model_dump(), weights=GIB, context=131072), 80).context == 32768


def test_show_memory_end_to_end(mreg: Any, tmp_path: Path) -> None:
    """A tiny llama (2 layers × 2 KV heads × 16 × 2 × 2 = 256 bytes per token) as hf and gguf:Q8_0."""
    src = build_tiny_llama(tmp_path / "tiny")
    ok(mreg("convert", src, "--to", "hf", "--to", "gguf:Q8_0", "--name", "m", "--json"))
    doc = ok(mreg("show", "m@1", "--json"))
    arts = {a["format"]: a for a in doc["manifest"]["artifacts"]}
    assert doc["manifest"]["model"]["kv_cache"]["bytes_per_token"] == {"f16": 256, "q8_0": 136, "q4_0": 72}
    assert arts["hf"]["weights_bytes"] > arts["gguf"]["weights_bytes"] > 0  # float32 source, Q8_0 file
    mem = 64 / 1024  # 64 MiB
    doc = ok(mreg("show", "m@1", "--memory", str(mem), "--context", "128", "--reserve", "0", "--json"))["serving"]
    assert doc["context"] == 128 and doc["kv_bytes_per_token"] == 256
    fits = {a["format"]: a for a in doc["artifacts"]}
    for fmt, a in fits.items():
        cache = int(64 * 2**20 * 0.9) - arts[fmt]["weights_bytes"]
        assert a["cache_bytes"] == cache and a["sequences"] == cache // (128 * 256)
        assert a["max_context"] == 256  # the model's own limit caps one sequence
    llama = fits["gguf"]["engines"]["llama.cpp"]
    n = fits["gguf"]["sequences"]
    assert llama["args"] == ["-c", str(128 * n), "-np", str(n), "--cache-type-k", "f16", "--cache-type-v", "f16"]
    assert llama["command"].startswith("llama-server -m ") and ".gguf" in llama["command"]
    assert fits["hf"]["engines"]["vllm"]["args"][:4] == ["--max-model-len", "128", "--max-num-seqs", str(
        fits["hf"]["sequences"])]
    q4 = ok(mreg("show", "m@1", "--memory", str(mem), "--cache-type", "q4_0", "--reserve", "0", "--json"))["serving"]
    q4fits = {a["format"]: a for a in q4["artifacts"]}
    assert q4["context"] == 256 and q4["context_from"] == "model"
    assert "vllm" not in q4fits["hf"]["engines"] and "vLLM has no q4_0" in q4fits["hf"]["notes"][0]
    assert q4fits["gguf"]["engines"]["llama.cpp"]["args"][-2:] == ["-fa", "on"]
    human = mreg("show", "m@1", "--memory", str(mem), "--reserve", "0")
    assert human.exit_code == 0 and "sequences of 256 tokens" in human.stdout and "llama-server -m" in human.stdout
    bad = mreg("show", "m@1", "--memory", "-3", "--json")
    assert bad.exit_code == 2 and "--memory takes a number above 0" in bad.json["error"]["message"]
    assert mreg("show", "m@1", "--context", "5", "--json").exit_code == 2


def _manifest(kv: dict[str, Any] | None, *, weights: int | None, context: int) -> Manifest:
    return Manifest.model_validate({
        "name": "m", "version": 1, "key": "0" * 64,
        "source": {"kind": "local", "repo": "r", "commit": "c", "files": []},
        "artifacts": [{"format": "hf", "path": "hf", "files": [], "converter": {"name": "hf", "version": "1"},
                       "duration_s": 0, "weights_bytes": weights,
                       "verification": {"status": "passed", "method": "m", "reference": "r"}}],
        "model": {"context_length": context, "kv_cache": kv},
        "created": {"user": "u", "host": "h", "at": "2026-01-01T00:00:00Z", "mreg_version": "0", "python": "3"},
    })


@pytest.mark.slow
def test_an_onnx_encoder_records_its_initializers_and_has_no_kv_cache(mreg: Any, tmp_path: Path,
                                                                      store_root: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from support.tiny_models import build_tiny_bert

    ok(mreg("convert", build_tiny_bert(tmp_path / "bert"), "--to", "onnx", "--name", "bert", "--json"))
    manifest = ok(mreg("show", "bert@1", "--json"))["manifest"]
    (art,) = manifest["artifacts"]
    sizes = {f["path"]: f["size"] for f in art["files"]}
    # The initializers are the external data file (the graph itself holds only small constants, if any).
    assert 0.9 * sizes["model.onnx.data"] <= art["weights_bytes"] <= sizes["model.onnx.data"] + sizes["model.onnx"]
    assert manifest["model"]["kv_cache"] is None
    r = mreg("show", "bert@1", "--memory", "8", "--json")
    assert r.exit_code == 3 and "no KV-cache figures" in r.json["error"]["message"]


@pytest.mark.parametrize(("cls", "arch"), [
    ("Gemma2Config", "Gemma2ForCausalLM"), ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    ("Qwen3NextConfig", "Qwen3NextForCausalLM"), ("Qwen2Config", "Qwen2ForCausalLM"),
    ("MistralConfig", "MistralForCausalLM"), ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
])
def test_family_rules_agree_with_transformers_own_configs(cls: str, arch: str) -> None:
    """transformers' own config classes: the layer kinds it writes (`layer_types`) are what mreg counts, and the
    family rules mreg falls back on for older configs (without `layer_types`) count the same."""
    transformers = pytest.importorskip("transformers")
    config_cls = getattr(transformers, cls, None)
    if config_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    config = {**config_cls().to_dict(), "architectures": [arch]}
    kv = kv_cache_of(config)
    assert kv is not None
    older = {k: v for k, v in config.items() if k != "layer_types"}
    assert kv_cache_of(older) == kv
    if cls == "Qwen3NextConfig":  # as the hub's config.json has it
        assert kv_cache_of({**older, "full_attention_interval": 4}) == kv
    kinds = config.get("layer_types")
    if kinds:
        assert kv.full_layers == kinds.count("full_attention")
        assert kv.window_layers == kinds.count("sliding_attention")
        assert kv.uncached_layers == len(kinds) - kv.full_layers - kv.window_layers
    if cls == "DeepseekV3Config":
        assert kv.attention == "mla" and kv.bytes_per_token["f16"] == config["num_hidden_layers"] * (
            config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
