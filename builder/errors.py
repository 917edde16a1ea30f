"""The one error tree. Every module raises these; only the CLI turns them into exit codes.

Exit codes (README, "Exit codes"):
  0  ok
  1  a verdict against a combination: unsatisfiable, a build or probe failure, a probe timeout,
     a regression (commands return 1; VerdictError exists for the places that must raise)
  2  bad input: a file, field or value is wrong (one line naming file:line field=value), or a
     table/attestation that fails a trust check (TrustError: tampered, rolled back, expired,
     signed by an unknown key)
  3  infrastructure: index or registry unreachable, no Docker daemon, the probe or docker broke,
     and `needs-gpu` — a check that needs a GPU could not run on this host. None of these says
     anything about the combination; they never replace an earlier verdict.
"""

from __future__ import annotations

OK, VERDICT, BAD_INPUT, INFRA = 0, 1, 2, 3
# A probe verdict's status -> the exit code of a command that reports one verdict.
EXIT_OF_VERDICT = {"pass": OK, "fail": VERDICT, "timeout": VERDICT, "needs-gpu": INFRA, "error": INFRA}


def exit_of_records(statuses, *, incomplete: bool = False) -> int:
    """A command that wrote records (ok | fail | error): any verdict against a combination is 1;
    else any infrastructure error, or work it could not do (`incomplete`), is 3."""
    statuses = set(statuses)
    if "fail" in statuses:
        return VERDICT
    return INFRA if "error" in statuses or incomplete else OK


class EnvbuildError(Exception):
    """Any expected failure; str() is the one line the user sees."""

    exit_code = BAD_INPUT


class InputError(EnvbuildError):
    """Bad user input: names the file, line, field and value."""

    def __init__(self, file: str, line: int | None, field: str, value: object, why: str):
        self.file, self.line, self.field, self.value, self.why = file, line, field, value, why
        where = f"{file}:{line}" if line else str(file)
        shown = repr(value)
        if len(shown) > 120:  # a hostile value must not flood the one line
            shown = shown[:100] + f"...' ({len(str(value))} chars)"
        super().__init__(f"{where}: {field}={shown}: {why}")


class UsageError(EnvbuildError):
    """A command line that does not make sense (missing argument, conflicting options)."""


class TrustError(EnvbuildError):
    """A signed table or attestation that must not be believed (bad signature, rollback,
    expired, unknown or changed key, file hashes that do not match)."""


class VerdictError(EnvbuildError):
    """A verdict against a combination raised where a command cannot simply return 1."""

    exit_code = VERDICT


class InfraError(EnvbuildError):
    """Infrastructure failure (index unreachable, no daemon, no GPU): never a verdict on a stack."""

    exit_code = INFRA

    def __init__(self, cause: str, message: str):
        self.cause, self.message = cause, message
        super().__init__(f"{cause}: {message}")
