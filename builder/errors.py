"""Errors that the CLI turns into one clear line (no traceback)."""

from __future__ import annotations


class EnvbuildError(Exception):
    """Any expected failure; str() is the one line the user sees."""

    exit_code = 2


class InputError(EnvbuildError):
    """Bad user input: names the file, line, field and value."""

    def __init__(self, file: str, line: int | None, field: str, value: object, why: str):
        self.file, self.line, self.field, self.value, self.why = file, line, field, value, why
        where = f"{file}:{line}" if line else str(file)
        super().__init__(f"{where}: {field}={value!r}: {why}")


class InfraError(EnvbuildError):
    """Infrastructure failure (index unreachable, no daemon): never a verdict on a stack."""

    exit_code = 3

    def __init__(self, cause: str, message: str):
        self.cause, self.message = cause, message
        super().__init__(f"{cause}: {message}")
