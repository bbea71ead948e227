"""Every on-disk name mreg uses, in one place.

Store::

    <store>/
      blobs/sha256/ab/ab12…              immutable, read-only, named by their sha256
      tmp/                               work and staging directories (same filesystem as blobs)
      tmp/stage-<host>-<pid>-<token>/    a version being built (registry.store.staging)
      tmp/<tree>.lock                    held by the writer of tmp/<tree> while it runs: gc removes only free trees
      tmp/oci-uploads/<sha>-<target>.json  chunked OCI uploads a killed push can resume (registry.oci.uploads)
      caches/<format>/…                  what converters keep to speed up rebuilds (TensorRT timing caches)
      caches/oci-image/ab/ab12….json     the digest of a file's tar layer (`push --as-image`), per blob and path
      gc.lock                            publishers hold it shared, gc exclusive
      events/undelivered.jsonl           alias-change events a URL did not take (S3: events/undelivered/<id>.json)
      locks/convert-<name>-<key>.lock    guards the lease beside it (held for a few ms per read or write)
      locks/convert-<name>-<key>.lease   the conversion lease: owner and expiry, renewed while the work runs;
                                         a second run waits for the version, or takes over once it expires
      models/<name>/
        versions/<n>/manifest.json       written last: its presence means the version is complete
        versions/<n>/<format>/…          the artifact tree, hard links to blobs
        versions/<n>/.deleted            tombstone left by gc so that <n> is never reused
        production -> versions/7         an alias: a relative symlink
        history.jsonl                    append-only log of alias changes
        .lock                            serializes alias writers

    models/<name>/checks/<n>/<time>-<golden>-<sha12>.json   golden-check records (append-only, beside the version)
    models/<name>/baselines/<golden>.json                   expected outputs of a golden set
    models/<name>/signatures/<n>/<time>-<key id[:12]>.json  signature records (append-only, beside the version;
                                                            the same keys in an S3 store)
    models/<name>/rollouts/<alias>.json                      a staged rollout of the alias (RolloutRecord); on S3
                                                            it is the `rollout` field of the alias record itself

S3 store (`s3://bucket/prefix/`): the same `blobs/` and `models/<name>/versions/<n>/manifest.json`,
plus `models/<name>/aliases/<alias>.json` (an alias record with its history),
`models/<name>/keys/<conversion key>.json` (finds a version by its key without listing),
`leases/<uuid>.json` (digests an in-flight push will reference),
`conversions/<name>/<conversion key>.json` (the lease of a conversion in progress: owner and expiry; never a
version, and outside `models/` so that nothing listing models sees it) and `gc.lock`.

Cache: huggingface_hub's own layout (`models--org--name/{blobs,snapshots,refs}`, named as its
own `repo_folder_name`) plus `models--org--name/.mreg/<commit>.json`, the record of what mreg
verified: inside the repository's folder, where the hub's scanner looks for nothing (a folder of
its own at the cache's top is a "corrupted repository" to `hf cache ls`), and gone with the
repository when `hf cache rm` removes it. Records an earlier mreg kept at the top (`.mreg/pulls/<repo
folder>/<commit>.json`) are moved into place on first use.

Alias names that would collide with these names are reserved (`RESERVED_ALIASES`).
"""

from __future__ import annotations

import re
from pathlib import Path

BLOBS = "blobs"
BLOB_ALGO = "sha256"
TMP = "tmp"
CACHES = "caches"
GC_LOCK = "gc.lock"
EVENTS = "events"
UNDELIVERED = "undelivered"
MODELS = "models"
VERSIONS = "versions"
MANIFEST = "manifest.json"
TOMBSTONE = ".deleted"
HISTORY = "history.jsonl"
ALIAS_LOCK = ".lock"
LOCK_SUFFIX = ".lock"
STAGE_PREFIX = "stage-"

LOCKS = "locks"
CHECKS = "checks"
SIGNATURES = "signatures"
BASELINES = "baselines"
ROLLOUTS = "rollouts"
#: The second alias a staged rollout adds: `production-canary` leads to the new version while `production` stays.
CANARY_SUFFIX = "-canary"

S3_ALIASES = "aliases"
S3_KEYS = "keys"
S3_LEASES = "leases"
S3_CONVERSIONS = "conversions"
LEASE_SUFFIX = ".lease"

CACHE_MREG = ".mreg"
CACHE_PULLS = "pulls"
CACHE_BLOBS = "blobs"
CACHE_SNAPSHOTS = "snapshots"
CACHE_REFS = "refs"

NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
ALIAS_RE = re.compile(r"\A[a-z][a-z0-9_-]{0,63}\Z")
#: Names under models/<name>/ that are not aliases (and "history", the log's stem, and "tmp", for readability).
RESERVED_ALIASES = frozenset({VERSIONS, CHECKS, BASELINES, SIGNATURES, ROLLOUTS, HISTORY.split(".")[0], TMP})
#: What mreg keeps in models/<name>/ besides aliases (and its own hidden temp names): directories, then files.
MODEL_DIRS = frozenset({VERSIONS, CHECKS, BASELINES, SIGNATURES, ROLLOUTS})
MODEL_FILES = frozenset({HISTORY, ALIAS_LOCK})


def blob_path(root: Path, sha256: str) -> Path:
    """Path of the blob with this digest."""
    return root / BLOBS / BLOB_ALGO / sha256[:2] / sha256


def blobs_dir(root: Path) -> Path:
    """Directory holding every blob."""
    return root / BLOBS / BLOB_ALGO


def undelivered_log(root: Path) -> Path:
    """Alias-change events no URL took, one JSON line each (the event, the URL, why), kept for a resend."""
    return root / EVENTS / f"{UNDELIVERED}.jsonl"


def s3_undelivered(event_id: str, url_digest: str) -> tuple[str, ...]:
    """One alias-change event a URL did not take, in an S3 store."""
    return (EVENTS, UNDELIVERED, f"{event_id}-{url_digest[:12]}.json")


def tmp_dir(root: Path) -> Path:
    """Directory for work and staging trees, on the store's filesystem."""
    return root / TMP


def staging_dir(root: Path, host: str, pid: int, token: str) -> Path:
    """A version tree being built; its name says by which host and process, so that a killed one is known."""
    return tmp_dir(root) / f"{STAGE_PREFIX}{host}-{pid}-{token}"


def lock_beside(path: Path) -> Path:
    """The lock that guards `path` while it is written (a tree under tmp/, a converter's cache file): its name
    and `.lock`, beside it. Kept after use: unlinking a lock races its next holder."""
    return path.with_name(path.name + LOCK_SUFFIX)


def caches_dir(root: Path) -> Path:
    """Directory of converters' rebuild caches: never part of a version, safe to delete."""
    return root / CACHES


def conversion_lock(root: Path, name: str, key: str) -> Path:
    """The lock that serializes runs of one conversion (same model name, same conversion key)."""
    return root / LOCKS / f"convert-{name}-{key[:32]}{LOCK_SUFFIX}"


def conversion_lease(root: Path, name: str, key: str) -> Path:
    """The lease of one conversion in progress (guarded by `conversion_lock`): who holds it, until when."""
    return conversion_lock(root, name, key).with_suffix(LEASE_SUFFIX)


def lease_lock(lease: Path) -> Path:
    """The `conversion_lock` of a lease file found on disk."""
    return lease.with_suffix(LOCK_SUFFIX)


def locks_dir(root: Path) -> Path:
    """Directory of the conversion locks and leases."""
    return root / LOCKS


def model_dir(root: Path, name: str) -> Path:
    """Directory of one model."""
    return root / MODELS / name


def versions_dir(root: Path, name: str) -> Path:
    """Directory holding the numbered versions of one model."""
    return model_dir(root, name) / VERSIONS


def version_dir(root: Path, name: str, version: int) -> Path:
    """Directory of one version."""
    return versions_dir(root, name) / str(version)


def alias_path(root: Path, name: str, alias: str) -> Path:
    """Path of an alias symlink."""
    return model_dir(root, name) / alias


def rollout_path(root: Path, name: str, alias: str) -> Path:
    """The rollout record of one alias (local store): replaced whole, under the model's alias lock."""
    return model_dir(root, name) / ROLLOUTS / f"{alias}.json"


def canary_alias(alias: str) -> str:
    """The alias that leads to the canary version while `alias` is under a staged rollout."""
    return alias + CANARY_SUFFIX


def alias_target(version: int) -> str:
    """The relative target an alias symlink carries for a version."""
    return f"{VERSIONS}/{version}"


def parse_alias_target(target: str) -> int | None:
    """The version an alias symlink target names, or None when it is not one of ours."""
    head, _, number = target.partition("/")
    return parse_version(number) if head == VERSIONS else None


#: A version number as mreg spells it on disk: ASCII digits, no leading zero, at most 18 of them (int64, and no
#: 5,000-digit int() from a hostile name). `[0-9]`, not `\d` or `str.isdigit`: those take "²" and "١" too.
VERSION_NAME_RE = re.compile(r"[1-9][0-9]{0,17}")


def parse_version(text: str) -> int | None:
    """The version number a name on disk (a version directory, a records directory) spells, or None."""
    return int(text) if VERSION_NAME_RE.fullmatch(text) else None


def pull_record_path(cache: Path, repo: str, commit: str) -> Path:
    """Where mreg keeps its record of a verified snapshot: inside the repository's folder."""
    return cache_repo_dir(cache, repo) / CACHE_MREG / f"{commit}.json"


def legacy_pull_record_path(cache: Path, repo: str, commit: str) -> Path:
    """Where an earlier mreg kept that record: a top-level folder huggingface_hub's scanner reports as corrupt."""
    return cache / CACHE_MREG / CACHE_PULLS / cache_repo_folder(repo) / f"{commit}.json"


def checks_dir(root: Path, name: str, version: int) -> Path:
    """Where the golden-check records of one version live."""
    return model_dir(root, name) / CHECKS / str(version)


def check_record_name(stamp: str, golden: str, golden_sha256: str) -> str:
    """The file name of one check record: time first, so that names sort oldest first."""
    return f"{stamp}-{golden}-{golden_sha256[:12]}.json"


def signatures_dir(root: Path, name: str, version: int) -> Path:
    """Where the signature records of one version live (beside it: the version itself never changes)."""
    return model_dir(root, name) / SIGNATURES / str(version)


def signature_record_name(stamp: str, key_id: str) -> str:
    """The file name of one signature record: time first, so that names sort oldest first."""
    return f"{stamp}-{key_id[:12]}.json"


def baseline_path(root: Path, name: str, golden: str) -> Path:
    """Where a golden set's baseline for a model lives."""
    return model_dir(root, name) / BASELINES / f"{golden}.json"


# -- S3: keys relative to the store's prefix, as path parts ---------------------------------


def s3_blob(sha256: str) -> tuple[str, ...]:
    """A blob's key: the same place as in a local store."""
    return (BLOBS, BLOB_ALGO, sha256[:2], sha256)


def s3_blobs() -> tuple[str, ...]:
    """The prefix of every blob."""
    return (BLOBS, BLOB_ALGO)


def s3_models() -> tuple[str, ...]:
    """The prefix of every model."""
    return (MODELS,)


def s3_versions(name: str) -> tuple[str, ...]:
    """The prefix of a model's versions."""
    return (MODELS, name, VERSIONS)


def s3_url(location: str, parts: tuple[str, ...]) -> str:
    """The s3:// URL of `parts` in the S3 store at `location` (`s3://bucket/prefix`): what a hook or a person is
    told (a Path() of it would read `s3:/bucket/…`)."""
    return "/".join([location.rstrip("/"), *parts])


def s3_version(name: str, number: int) -> tuple[str, ...]:
    """The prefix of one version."""
    return (MODELS, name, VERSIONS, str(number))


def s3_manifest(name: str, number: int) -> tuple[str, ...]:
    """A version's manifest: its create-only PUT publishes the version."""
    return (*s3_version(name, number), MANIFEST)


def s3_signatures(name: str, number: int) -> tuple[str, ...]:
    """The prefix of one version's signature records: the same names as in a local store."""
    return (MODELS, name, SIGNATURES, str(number))


def s3_aliases(name: str) -> tuple[str, ...]:
    """The prefix of a model's alias records."""
    return (MODELS, name, S3_ALIASES)


def s3_alias(name: str, alias: str) -> tuple[str, ...]:
    """One alias record (target and history), replaced by If-Match."""
    return (MODELS, name, S3_ALIASES, f"{alias}.json")


def s3_key_index(name: str, key: str) -> tuple[str, ...]:
    """The index entry that finds a version by its conversion key."""
    return (MODELS, name, S3_KEYS, f"{key}.json")


def s3_leases() -> tuple[str, ...]:
    """The prefix of push leases."""
    return (S3_LEASES,)


def s3_lease(lease_id: str) -> tuple[str, ...]:
    """One push lease."""
    return (S3_LEASES, f"{lease_id}.json")


def s3_conversion_leases() -> tuple[str, ...]:
    """The prefix of every conversion lease."""
    return (S3_CONVERSIONS,)


def s3_conversion_lease(name: str, key: str) -> tuple[str, ...]:
    """The lease of one conversion in progress, taken create-only and replaced by If-Match on its ETag."""
    return (S3_CONVERSIONS, name, f"{key}.json")


def s3_gc_lock() -> tuple[str, ...]:
    """The object a running gc holds."""
    return (GC_LOCK,)


# -- cache: huggingface_hub's layout, named by its own helper -------------------------------


def cache_repo_dir(cache: Path, repo: str) -> Path:
    """A repository's folder in the cache (`models--org--name`)."""
    return cache / cache_repo_folder(repo)


def cache_repo_folder(repo: str) -> str:
    """`org/name` → `models--org--name`, as huggingface_hub's `repo_folder_name` names it (the tests hold the two
    equal). Spelled out here: importing huggingface_hub for it cost a local pull and convert 0.19 s each."""
    return "--".join(["models", *repo.split("/")])


def cache_blobs_dir(cache: Path, repo: str) -> Path:
    """A repository's file contents, named by etag or digest."""
    return cache_repo_dir(cache, repo) / CACHE_BLOBS


def cache_snapshot_dir(cache: Path, repo: str, commit: str) -> Path:
    """A commit's files, as links into the blobs."""
    return cache_repo_dir(cache, repo) / CACHE_SNAPSHOTS / commit


def cache_ref_path(cache: Path, repo: str, revision: str) -> Path:
    """The file holding the commit a branch or tag pointed to."""
    return cache_repo_dir(cache, repo) / CACHE_REFS / revision


# -- serving: a Triton model repository (`mreg export triton`) -------------------------------------------

TRITON_CONFIG = "config.pbtxt"


def triton_model_dir(repo: Path, name: str) -> Path:
    """A model's directory in a Triton repository: config.pbtxt and one directory per served version."""
    return repo / name


def triton_plan_name(sm: str) -> str:
    """The plan link for one compute capability (`86` → `model_sm86.plan`), named in cc_model_filenames."""
    return f"model_sm{sm}.plan"


# -- OCI image layout (`oci-layout:DIR`, what `skopeo copy oci:DIR …` reads) -----------------------------
#
#     <dir>/oci-layout                 {"imageLayoutVersion": "1.0.0"}
#     <dir>/index.json                 the manifests, each tagged by org.opencontainers.image.ref.name
#     <dir>/blobs/sha256/<hex>         manifests, configs and layers, named by their digest

OCI_LAYOUT_FILE = "oci-layout"
OCI_INDEX_FILE = "index.json"


def oci_index_lock(directory: Path) -> Path:
    """Serializes the writers of an OCI image layout's index.json."""
    return lock_beside(directory / OCI_INDEX_FILE)


def oci_blob_path(root: Path, digest: str) -> Path:
    """A blob of an OCI image layout (`sha256:HEX` → `blobs/sha256/HEX`)."""
    algo, _, hexdigest = digest.partition(":")
    return root / BLOBS / algo / hexdigest


# -- OCI upload sessions (a chunked push killed mid-blob resumes it) ---------------------------------------
#
#     <store>/tmp/oci-uploads/<blob hex>-<target hash16>.json   one session: upload URL, digest, size, bytes confirmed
#     <store>/tmp/oci-uploads.lock                              held shared by every running push (gc: exclusive)

OCI_UPLOADS = "oci-uploads"


def oci_uploads_dir(root: Path) -> Path:
    """Where a store keeps the OCI upload sessions of its pushes (under tmp/, so gc sweeps it like staging)."""
    return root / TMP / OCI_UPLOADS


def oci_uploads_lock(root: Path) -> Path:
    """Held shared by every running push, exclusively by gc (the lock of a tree under tmp/, `lock_beside`)."""
    return lock_beside(oci_uploads_dir(root))


def oci_upload_session(directory: Path, blob_hex: str, target_hash: str) -> Path:
    """One blob's upload session to one target (`blob_hex` "*" gives the glob of the target's sessions)."""
    return directory / f"{blob_hex}-{target_hash}.json"


def oci_upload_lock(session: Path) -> Path:
    """Held by the push that sends the session's blob."""
    return session.with_suffix(LOCK_SUFFIX)


# -- OCI images (`push --as-image`): the digest of each file's tar layer, kept per blob and path --------------
#
#     <store>/caches/oci-image/ab/ab12….json

OCI_IMAGE_CACHE = "oci-image"


def oci_image_cache(root: Path, key: str) -> Path:
    """Where the tar layer digest of one (blob, path) is kept: `key` is their sha256 (registry.oci.image)."""
    return caches_dir(root) / OCI_IMAGE_CACHE / key[:2] / f"{key}.json"
