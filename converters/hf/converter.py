"""The identity format `hf`: the safetensors snapshot as is, what vLLM and TGI mount."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from manifests import Artifact, Manifest, Verification
from registry.convert.protocol import (
    ConversionRequest,
    ConversionResult,
    Converter,
    ConverterBase,
    Prepared,
    RawOptions,
    Session,
    TargetOptions,
)
from registry.errors import UsageError


@dataclass(frozen=True)
class HFOptions:
    """The identity format's options: none."""

    format: ClassVar[str] = "hf"


class HFConverter(ConverterBase):
    """Places every source file in the artifact tree unchanged, and checks each digest."""

    format: ClassVar[str] = "hf"
    name: ClassVar[str] = "mreg.hf"
    #: Part of the conversion key: raised when what a conversion checks changes, so older results are made again.
    #: 2: every float tensor read for NaN/Inf; safetensors headers and JSON configs must parse.
    #: 3: the weights' bytes are recorded (serving-memory plans).
    #: 4: shard indexes agree with their shards; config sizes bounded by the weights; headers as the loaders read them.
    version: ClassVar[str] = "4"

    def parse(self, raw: RawOptions) -> HFOptions:
        """The identity format takes no options."""
        if raw:
            raise UsageError(f"--to hf takes no options (got {', '.join(sorted(raw))})", hint="use plain --to hf")
        return HFOptions()

    def prepare(self, options: TargetOptions) -> Prepared:
        """Nothing to check or read."""
        return Prepared(self.format, {})

    def tool_versions(self) -> dict[str, str]:
        """No tool touches the bytes."""
        return {}

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Link (or copy) each source file into the tree; the digest of each must equal the source's, every
        safetensors header and JSON config must parse (else an IntegrityError naming the file, before anything is
        placed), and no floating-point safetensors tensor may hold NaN or Inf."""
        from converters.hf import weights
        from registry.convert.configs import check_configs, check_sizes

        sources = {f.path: request.source_files(f.path) for f in request.source.files}
        check_configs(sources, request.configs_read)
        # No engine could build the model its config describes from these weights.
        check_sizes(sources, request.configs_read)
        found = weights.scan({label: path for label, path in sources.items() if label.endswith(".safetensors")})
        known: dict[str, str] = {}
        mismatched: list[str] = []
        for f in request.source.files:
            digest = request.place(request.source_files(f.path), f.path, f.sha256)
            known[f.path] = digest
            if digest != f.sha256:
                mismatched.append(f.path)
        # The placed bytes are the source's (same digest): what was read of the source is what was published.
        problems = [f"mismatched: {', '.join(mismatched)}"] if mismatched else []
        problems += weights.problems(found)
        return ConversionResult(
            verification=Verification(
                status="failed" if problems else "passed",
                method="identity: the sha256 of every file equals the verified source snapshot; every "
                       "safetensors header and JSON config parses; every floating-point safetensors tensor read "
                       "for NaN and Inf",
                reference=f"{request.source.repo}@{request.source.commit}",
                inputs=tuple(f.path for f in request.source.files),
                metrics={"files": float(len(known)), "mismatched_files": float(len(mismatched)),
                         "float_tensors": float(found.tensors),
                         "nonfinite_values": float(sum(found.nonfinite.values()))},
                tolerance={"mismatched_files": 0.0, "nonfinite_values": 0.0},
                detail="; ".join(problems) or None,
            ),
            known_digests=known,
            # The safetensors files as they are (headers included: a few KiB), which is what an engine maps.
            weights_bytes=sum(f.size for f in request.source.files if f.path.endswith(".safetensors")),
        )

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """transformers on the CPU (or the first GPU)."""
        from converters.hf.runtime import open_session

        return open_session(artifact_dir, artifact, manifest)


#: What `registry.convert.formats` loads; the annotation has mypy check the class against the protocol.
CONVERTER: Converter = HFConverter()
