"""The one exception hierarchy of the project.

Every error says what was expected and what was found, and where: the file, the byte position and the
batch base offset when they are known. ``retryable`` tells automation whether trying again can help.
The CLI maps these classes to exit codes in one place (``tiering.cli``).
"""

from __future__ import annotations


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
        """Return a copy of this error that also names where it happened (fields already set win)."""
        return type(self)(
            self.message,
            path=self.path if self.path is not None else path,
            position=self.position if self.position is not None else position,
            base_offset=self.base_offset if self.base_offset is not None else base_offset,
            expected=self.expected,
            found=self.found,
        )

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


class ProofError(InvalidDataError):
    """A rewritten batch does not decode back to the original records: nothing is written."""


class ConfigError(TieringError):
    """Bad usage or configuration (CLI exit code 2)."""
