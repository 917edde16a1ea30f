"""The one error tree. Every module raises these; only the CLI turns them into exit codes.
An outcome that is not an error (a verdict, a record, a lock result) gets its code from
envbuild.outcome, from the same table.

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

from .probe.vocab import EXIT_BAD_INPUT as BAD_INPUT
from .probe.vocab import EXIT_INFRA as INFRA
from .probe.vocab import EXIT_OK as OK  # noqa: F401 - the codes' home is the vocabulary (shared with the probe)
from .probe.vocab import EXIT_VERDICT as VERDICT

# Ended by a signal, as the shell reports it (128 + the signal): ^C, and a reader that went away.
INTERRUPTED, BROKEN_PIPE = 130, 141

# The exit code of a command's outcomes (verdicts, records, lock results): envbuild.outcome.


class EnvbuildError(Exception):
    """Any expected failure; str() is the one line the user sees."""

    exit_code = BAD_INPUT


class MissingDependency(EnvbuildError):
    """A command whose module needs a distribution this install lacks (the default, pick's)."""


    def __init__(self, command: str, module: str):
        top = module.split(".")[0]
        dist = {"yaml": "PyYAML", "jinja2": "Jinja2", "hydra": "hydra-core", "omegaconf": "omegaconf",
                "oras": "oras", "rich": "rich", "requests": "requests", "uv": "uv"}.get(top, top)
        super().__init__(f"envbuild {command} needs {dist} (module {top!r}), which this install lacks: "
                         f"pip install 'envbuild[all]' (the default install is pick's and verify's)")


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
