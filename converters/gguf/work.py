"""What every GGUF conversion prepares before its first byte, once, for a named type as for gguf:auto.

The configs checked, the model planned for each type (config.json, the tokenizer files and the safetensors
headers: an unsupported model fails before any output), what cannot be encoded refused, the importance
matrix made or copied in (`converters.gguf.importance`), and the float32 reference pass started beside the
write where llama.cpp will compare against it (`converters.gguf.overlap`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from converters.gguf import overlap
from converters.gguf.importance import Made, importance_for
from converters.gguf.naming import general_name, source_name
from converters.gguf.plan import EncodedTensor, GGUFPlan, plans
from converters.gguf.quants import ggml_available, needs_ggml
from manifests import GGUFImportance, GGUFRequirements, Verification
from registry.config import MREG_GGUF_QUANTIZER
from registry.convert.configs import check_configs
from registry.convert.protocol import ConversionRequest, ConversionResult, Options
from registry.errors import UsageError

#: The reference forward pass's ids and logits, saved once for every file and candidate of one source.
REFERENCE_CACHE = ".mreg-reference.npz"


@dataclass(frozen=True)
class Work:
    """One conversion's ground: the plans (with the importance matrix's metadata where weighted) and where the
    files go."""

    directory: Path
    #: The model's name in the store, so the engine's path is the same from one version to the next.
    base: str
    planned: list[GGUFPlan]
    weighted: list[bool]
    #: The plans that may be written (gguf:auto passes over those needing a matrix it does not have).
    eligible: list[int]
    made: Made | None

    @property
    def reference(self) -> Path:
        """Where the reference pass keeps its logits, for every file and candidate."""
        return self.directory / REFERENCE_CACHE

    def start_reference(self, evaluation: tuple[Path, int] | None) -> overlap.Ahead | None:
        """The float32 reference pass, started in a child beside the write where llama.cpp will compare."""
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:  # no runtime check, so no reference to compare with
            return None
        return overlap.start(self.directory, self.reference, evaluation)


def prepare(requests: Sequence[ConversionRequest], directory: Path, types: Sequence[str], weighted: Sequence[bool],
            *, pass_over: bool = False) -> Work:
    """Check, plan, refuse, and make or read the importance matrix. `pass_over`: a type whose mix needs a matrix
    that was not given is left out rather than refused (gguf:auto: the user named no type)."""
    first = requests[0]
    # Every config read below (by mreg and by gguf's vocabulary reader) is a JSON object, or nothing is done.
    check_configs({f.path: first.source_files(f.path) for f in first.source.files}, first.configs_read)
    shards = sorted(p for p in directory.rglob("*.safetensors"))
    base = first.name or first.source.repo.rstrip("/").split("/")[-1] or "model"
    # general.name is the model's own (llama.cpp applies rules by name), never the store's.
    planned = plans(directory, shards, list(types), general_name(directory, source_name(first.source), first.config),
                    has_imatrix=list(weighted), config=first.config)
    eligible = [i for i, p in enumerate(planned)
                if not pass_over or weighted[i] or not any(c.needs_imatrix for c in p.choices)]
    refuse_unencodable([planned[i] for i in eligible], [weighted[i] for i in eligible])
    made = importance_for(requests, directory, base, planned[0])
    if made:  # llama-quantize records the importance matrix in keys it appends
        planned = [replace(p, metadata=[*p.metadata, *made.info]) if w else p
                   for p, w in zip(planned, weighted, strict=True)]
    return Work(directory, base, planned, list(weighted), eligible, made)


def is_weighted(options: Options) -> bool:
    """Whether a target's options name an importance matrix (a calibration text or a file)."""
    return bool(options.get("calibration") or options.get("imatrix"))


def ahead_metrics(ahead: overlap.Ahead, metrics: dict[str, float]) -> dict[str, float]:
    """The reference pass's seconds when it ran beside the write (and the verification used its logits)."""
    seconds = overlap.finish(ahead)
    if seconds is None or "reference_seconds" in metrics:  # it failed, or the verification computed its own
        return {}
    return {"reference_seconds": seconds, "reference_overlapped": 1.0}


def imatrix_refusal(file_type: str, tensor: str, qtype: str) -> UsageError:
    """The refusal of a type that llama.cpp writes only with an importance matrix, naming what to add."""
    return UsageError(f"gguf:{file_type} needs an importance matrix: llama.cpp writes {tensor} as {qtype} only "
                      "with one",
                      hint="add --calibration FILE (or --calibration default), or --imatrix FILE from llama-imatrix")


def refuse_unencodable(planned: Sequence[GGUFPlan], weighted: Sequence[bool]) -> None:
    """Before any byte: a tensor llama.cpp writes only with an importance matrix, or a type (or weighting) only
    llama.cpp's encoder writes where it is absent, is a usage error naming what to add."""
    for p, w in zip(planned, weighted, strict=True):
        needs = [c for c in p.choices if c.needs_imatrix]
        if needs and not w:
            raise imatrix_refusal(p.file_type, needs[0].name, needs[0].qtype)
        if not ggml_available():
            odd = sorted({c.qtype for c in p.choices if needs_ggml(c.qtype, w)})
            if odd:
                raise UsageError(f"gguf:{p.file_type}{' with an importance matrix' if w else ''} takes llama.cpp's "
                                 f"encoder ({', '.join(odd)}), and llama-cpp-python is not installed"
                                 f"{' or MREG_GGUF_QUANTIZER=numpy' if MREG_GGUF_QUANTIZER.value() else ''}",
                                 hint="pip install 'mreg[gguf]' (llama-cpp-python), and unset MREG_GGUF_QUANTIZER")


def result(p: GGUFPlan, dest: Path, digest: str, encoded: list[EncodedTensor],
            verification: Verification, importance: GGUFImportance | None = None) -> ConversionResult:
    """What the registry gets for one file: its digest, verification, requirements and encoders."""
    counts = Counter(e.info.qtype for e in encoded)
    requirements = GGUFRequirements(
        architecture=p.model.architecture,
        quantization=p.file_type,
        tensor_types=dict(sorted(counts.items())),
        fallbacks={e.info.name: f"{e.choice.wanted}->{e.choice.qtype}: {e.choice.reason}"
                   for e in encoded if e.choice.wanted},
        imatrix=importance,
    )
    encoders: dict[str, set[str]] = {}
    for e in encoded:
        encoders.setdefault(e.info.qtype, set()).add(e.encoder)
    return ConversionResult(
        verification=verification,
        known_digests={dest.name: digest},
        requirements=requirements,
        tool_versions={"gguf-encoders": ",".join(f"{q}={'+'.join(sorted(e))}" for q, e in sorted(encoders.items()))},
        weights_bytes=sum(i.nbytes for i in p.infos),
    )
