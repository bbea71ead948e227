"""The one error hierarchy of mreg: every error carries its data, a hint and an exit code."""

from __future__ import annotations

from typing import Any, ClassVar


class MregError(Exception):
    """Root of every error mreg raises on purpose."""

    exit_code: ClassVar[int] = 1
    hint: str | None = None
    #: Structured facts for `--json` (e.g. a failed verification's metrics); the message stays one line.
    details: dict[str, Any] | None = None

    def __init__(self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint
        if details is not None:
            self.details = details


class UsageError(MregError):
    """The command line or configuration is incomplete or contradictory."""

    exit_code = 2


class PermissionDenied(MregError, PermissionError):
    """The filesystem refused a read or a write (a read-only store or cache, another user's files)."""

    exit_code = 1

    @classmethod
    def from_os_error(cls, e: OSError) -> PermissionDenied:
        """The error of a refused file operation, naming the path the filesystem named."""
        where = f" {e.filename}" if e.filename is not None else ""
        return cls(f"permission denied:{where} ({e.strerror or 'refused'})",
                   hint="mreg needs to write its store and cache: check the permissions of that path, or point "
                        "--store / --cache-dir at directories you can write")


class NotFound(MregError, LookupError):
    """A model, version, alias, revision or file does not exist."""

    exit_code = 3


class IntegrityError(MregError):
    """Bytes on disk or on the wire do not match their recorded digest, or are not where they claim to be."""

    exit_code = 4


class Conflict(MregError):
    """Another writer got there first (lost race, or `--expect` did not hold)."""

    exit_code = 5


class GateRefused(MregError):
    """A promotion gate refused the version."""

    exit_code = 6


class InsufficientSpace(MregError, OSError):
    """The destination filesystem cannot hold what is about to be written."""

    exit_code = 7


class UnsafeInput(MregError):
    """Input that mreg refuses to handle: pickle weights, path-traversing names."""

    exit_code = 8


class HubUnavailable(MregError):
    """The hub could not be reached and the cache cannot answer instead."""

    exit_code = 9


class EngineNotReady(MregError):
    """The engine failed its reload or readiness check after a promotion; the alias was flipped back."""

    exit_code = 10
    outcome: object = None


class CheckFailed(MregError):
    """A golden-set check did not pass."""

    exit_code = 11


class RuntimeCrashed(MregError):
    """A native runtime (llama.cpp, ONNX Runtime, TensorRT) died in its own process; mreg reports it and goes on."""

    exit_code = 12

    def __init__(self, message: str, *, hint: str | None = None, returncode: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.returncode = returncode


class CredentialsRefused(MregError, PermissionError):
    """A registry refused the credentials it was given (or asked for some and none were found)."""

    exit_code = 13


class Interrupted(MregError):
    """Stopped on request (SIGINT, SIGTERM) at a point the next run resumes from."""

    exit_code = 130


class StoreUnreachable(HubUnavailable):
    """A remote store could not be reached or answered with an unexpected error."""


class VersionNotFound(NotFound):
    """A reference does not name an existing version."""

    def __init__(self, name: str, ref: str) -> None:
        super().__init__(f"{name}@{ref} does not exist", hint=f"run `mreg list {name}` to see its versions")
        self.name, self.ref = name, ref


class ModelNotFound(NotFound):
    """The store holds no model of this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"model {name!r} is not in the store", hint="run `mreg list` to see the models in the store")
        self.name = name


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "error",
    2: "usage or configuration error",
    3: "not found (model, version, alias, repository, revision)",
    4: "integrity failure (a digest does not match, a symlink leads out of the store, a remote object disagrees "
       "with its key)",
    5: "conflict: lost a race with another writer, --expect did not hold, or another run holds the conversion's lease",
    6: "refused by a promotion gate, or no gguf:auto candidate meets the budget",
    7: "not enough free space",
    8: "unsafe input refused (pickle weights, path-traversing file names)",
    9: "hub or remote store unreachable or stalled (and, for pulls, nothing usable in the cache)",
    10: "promoted, but the engine failed its reload or readiness check: the alias was flipped back",
    11: "a golden-set check failed (`mreg check`)",
    12: "a native runtime (llama.cpp) crashed in its own process; mreg recorded nothing",
    13: "an OCI registry refused the credentials (or needs some and none were found)",
}

#: Exit codes a job engine (a Kubernetes podFailurePolicy, Argo's retryStrategy, a CI retry) should run again: the
#: failure is about this attempt's surroundings, not its inputs. 5: a lost race or lease, the next attempt finds the
#: winner's version or takes over; 7: a full disk, whose partial work mreg already removed (another node, or space
#: freed, can succeed); 9: an unreachable or stalled hub, store or registry; 12: a native runtime that died in its own
#: process (memory pressure or a node's driver as often as the input); 130: stopped by a signal (a drained node).
#: Every other failure repeats on the same inputs (usage 2, not found 3, integrity 4, a gate or failed verification
#: 6, unsafe input 8, a failed check 11, refused credentials 13, and 1: unclassified, which includes mreg's own bugs),
#: so a retry only spends the engine's budget.
RETRYABLE: frozenset[int] = frozenset({5, 7, 9, 12, 130})


def retryable(exit_code: int) -> bool:
    """Whether a job engine should run a command that exited with `exit_code` again (see RETRYABLE)."""
    return exit_code in RETRYABLE
