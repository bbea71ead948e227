"""Media types and annotation keys: ModelPack's (CNCF), the older CNAI ones accepted on pull, OCI's and mreg's."""

from __future__ import annotations

from pathlib import PurePosixPath

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
#: A regular image (`--as-image`): its config, and uncompressed tar layers.
IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
IMAGE_CONFIG_TYPES = frozenset({IMAGE_CONFIG, "application/vnd.docker.container.image.v1+json"})
TAR_LAYER = "application/vnd.oci.image.layer.v1.tar"
#: The types a copy may give mreg's uncompressed tar layers: containers/image (skopeo, podman) labels every layer of
#: a Docker manifest `…tar.gzip`, whatever its bytes. Only a label: the bytes are held to mreg's tar when read.
DOCKER_TAR_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
TAR_LAYERS = frozenset({TAR_LAYER, f"{TAR_LAYER}+gzip", f"{TAR_LAYER}+zstd",
                        DOCKER_TAR_LAYER, f"{DOCKER_TAR_LAYER}.gzip"})
#: The empty descriptor's blob (`{}`): the config of an artifact that needs none (a signature).
EMPTY_DATA = b"{}"
EMPTY_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
#: mreg's own manifest, carried as a layer: its digest is the version's manifest digest.
MREG_MANIFEST = "application/vnd.mreg.manifest.v1+json"

#: What a pull accepts as a model artifact: ModelPack, the CNAI names it replaced, and ORAS's untyped artifacts.
ARTIFACT_TYPES = frozenset({MODEL_ARTIFACT, "application/vnd.cnai.model.manifest.v1+json"})
CONFIG_TYPES = frozenset({MODEL_CONFIG, "application/vnd.cnai.model.config.v1+json", OCI_EMPTY,
                          "application/vnd.unknown.config.v1+json"})
#: Layer types a pull writes as files (raw bytes; tar or compressed layers are images, not model files).
RAW_PREFIXES = ("application/vnd.cncf.model.", "application/vnd.cnai.model.")
#: ORAS (oras-py and the oras CLI) pushes a file as an image's tar layer type with its bytes as they are; a
#: directory as `…tar+gzip` with the unpack annotation. Only outside an image (config `…image.config…`) is it a file.
ORAS_FILE = TAR_LAYER
ORAS_UNPACK = "io.deis.oras.content.unpack"

#: A Sigstore bundle (what model-signing writes), as cosign attaches one: the referrer's artifactType and its layer.
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"

TITLE = "org.opencontainers.image.title"
REF_NAME = "org.opencontainers.image.ref.name"
CREATED = "org.opencontainers.image.created"
FILEPATH = "org.cncf.model.filepath"
MREG_NAME = "dev.mreg.name"
MREG_VERSION = "dev.mreg.version"
MREG_FORMAT = "dev.mreg.format"
MREG_PATH = "dev.mreg.path"
MREG_MANIFEST_DIGEST = "dev.mreg.manifest-digest"
VERSION = "org.opencontainers.image.version"
BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"
#: cosign's annotations on a bundle referrer (what it holds), and mreg's (the record's claims: never trusted).
BUNDLE_CONTENT = "dev.sigstore.bundle.content"
BUNDLE_PREDICATE = "dev.sigstore.bundle.predicateType"
SIG_SIGNER = "dev.mreg.signature.signer"
SIG_KEY_ID = "dev.mreg.signature.key-id"
SIG_METHOD = "dev.mreg.signature.method"
SIG_ORIGIN = "dev.mreg.signature.origin"
SIG_BY = "dev.mreg.signature.by"

_WEIGHTS = (".safetensors", ".gguf", ".onnx", ".onnx_data", ".data", ".plan", ".engine", ".bin", ".pt", ".pth")
_DOCS = (".md", ".txt", ".rst", ".pdf")
_CODE = (".py", ".sh", ".jinja", ".j2")


def layer_type(path: str) -> str:
    """The ModelPack media type of a file by its kind: weights, their configuration, documentation, code."""
    p = PurePosixPath(path)
    name, suffix = p.name.lower(), p.suffix.lower()
    if suffix in _WEIGHTS:
        return WEIGHT
    if suffix in _DOCS or name.startswith(("readme", "license", "licence", "notice")):
        return DOC
    if suffix in _CODE:
        return CODE
    return WEIGHT_CONFIG


def is_raw_file(media_type: str) -> bool:
    """Whether a layer of this type is a file's bytes as they are (what a pull writes)."""
    return (media_type.startswith(RAW_PREFIXES) and not media_type.endswith(("+json", ".tar", "+gzip", "+zstd"))) \
        or media_type in ("application/octet-stream", "")


def is_oras_file(media_type: str, config_type: str, annotations: dict[str, str]) -> bool:
    """Whether an artifact's layer is a file ORAS pushed as it is (not an image's tar layer, not a packed
    directory)."""
    return media_type == ORAS_FILE and config_type not in IMAGE_CONFIG_TYPES and ORAS_UNPACK not in annotations
