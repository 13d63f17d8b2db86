"""The one exception hierarchy of the project.

Every error says what was expected and what was found, and where: the file, the byte position and the
batch base offset when they are known. ``retryable`` tells automation whether trying again can help.
The CLI maps these classes to exit codes in one place (``tiering.cli``): invalid data 1, usage or
configuration 2, busy/conflict 3, a transient S3 or network failure (``retryable``) 4, a failed proof 5.
"""

from __future__ import annotations

import copy
from enum import IntEnum


class ExitCode(IntEnum):
    """The command line's exit codes, by category (the contract automation relies on)."""

    OK = 0
    INVALID = 1  # the data is invalid (corrupt, unsupported): retrying does not help
    USAGE = 2  # usage or configuration (bad arguments, missing credentials, access denied)
    BUSY = 3  # work left because another run holds a partition or a writer changed a segment: retry later
    RETRY = 4  # S3 or the network failed (throttling, 5xx, a connection cut or refused): retry
    INTERNAL = 5  # a proof failed: what we wrote does not hold the source's records (report it; nothing changed)
    INTERRUPTED = 130


class TieringError(Exception):
    """Root of every error raised on purpose by this package."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        position: int | None = None,
        base_offset: int | None = None,
        expected: object = None,
        found: object = None,
    ) -> None:
        self.message = message
        self.path = path
        self.position = position
        self.base_offset = base_offset
        self.expected = expected
        self.found = found
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.base_offset is not None:
            where.append(f"batch base offset {self.base_offset}")
        text = self.message
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        return f"{': '.join([', '.join(where)])}: {text}" if where else text

    def located(
        self, *, path: str | None = None, position: int | None = None, base_offset: int | None = None
    ) -> TieringError:
        """Return a copy of this error that also names where it happened (fields already set win; every other
        attribute, such as an S3 error's code, status and retryability, is kept)."""
        err = copy.copy(self)
        err.path = self.path if self.path is not None else path
        err.position = self.position if self.position is not None else position
        err.base_offset = self.base_offset if self.base_offset is not None else base_offset
        err.args = (err._render(),)
        return err

    def inside(self, what: str, *, position: int | None, base_offset: int | None) -> TieringError:
        """This error, raised while reading something nested (a legacy wrapper's inner message set), moved
        to the outer entry's position and offset; its own position becomes part of the message."""
        inner = f" at byte {self.position}" if self.position is not None else ""
        return type(self)(f"{what}{inner}: {self.message}", path=self.path, position=position,
                          base_offset=base_offset, expected=self.expected, found=self.found)

    def to_dict(self) -> dict[str, object]:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "path": self.path,
            "position": self.position,
            "base_offset": self.base_offset,
            "expected": None if self.expected is None else str(self.expected),
            "found": None if self.found is None else str(self.found),
            "retryable": self.retryable,
        }


class InvalidDataError(TieringError):
    """The data is corrupt or breaks the Kafka format (CLI exit code 1)."""


class CorruptBatchError(InvalidDataError):
    """A batch or message fails a structural or checksum check."""


class DecompressionError(InvalidDataError):
    """A compressed payload cannot be decoded, or would decode past the configured limit."""


class UnsupportedError(InvalidDataError):
    """Valid Kafka data that this tool does not handle (for example Kafka 0.7 message sets)."""


class IndexMismatchError(InvalidDataError):
    """An index file is not valid for its log segment."""


class ProofError(TieringError):
    """A rewritten batch does not decode back to the original records, or what storage holds is not what we
    wrote: nothing is written or swapped in. The source is not at fault (CLI exit code 5: our bug, or the
    machine's or the store's); it is never remembered as invalid."""


class ConfigError(TieringError):
    """Bad usage or configuration (CLI exit code 2)."""


class StorageError(TieringError):
    """An S3 request failed (its subclasses live with the store interface, :mod:`tiering.storage.objects`); ``code`` is
    S3's error code, ``status`` the HTTP status and ``request_id`` S3's request id (what AWS support asks
    for), where S3 answered at all."""

    code: str = ""
    status: int | None = None
    request_id: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "code": self.code, "status": self.status, "request_id": self.request_id}


class ConflictError(TieringError):
    """Busy or conflict: another run holds what we need, or a writer changed it after we planned (CLI exit
    code 3). Nothing was changed; a later run, planning anew, can do the work."""

    retryable = True


def exit_code(error: TieringError) -> ExitCode:
    """The exit code of a command that stopped on ``error``."""
    if isinstance(error, ProofError):
        return ExitCode.INTERNAL
    if isinstance(error, ConflictError):
        return ExitCode.BUSY
    if error.retryable:
        return ExitCode.RETRY
    if isinstance(error, InvalidDataError):
        return ExitCode.INVALID
    if isinstance(error, ConfigError | StorageError):
        return ExitCode.USAGE  # S3 refusing a request is the setup's problem, not the data's
    return ExitCode.INVALID
