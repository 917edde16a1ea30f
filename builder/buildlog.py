"""What a failed build's output says: which BuildKit step ran and failed, and the class of the
failure (a verdict on the stack, or infrastructure), from its last lines."""

from __future__ import annotations

import re
from typing import Callable

# Failure classes, most specific first: (cause, status, pattern over the build's last lines).
# status "fail" is a verdict on the stack; "error" is infrastructure (never a verdict).
CLASSES: list[tuple[str, str, re.Pattern]] = [
    ("daemon-error", "error", re.compile(
        r"Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|"
        r"no space left on device|failed to (solve|create LLB|compute cache key|export)|"
        r"Error response from daemon|failed to read dockerfile|rpc error: code = Unavailable", re.I)),
    ("unsatisfiable", "fail", re.compile(
        r"No solution found when resolving|ResolutionImpossible|conflicting dependencies|"
        r"Because .* depends on .*we can conclude", re.I)),
    ("missing-wheel", "fail", re.compile(
        r"GLIBC_\d+\.\d+'? not found|no wheels? (with|for) a matching (platform|Python)|"
        r"is not a supported wheel on this platform|doesn't have a source distribution or wheel|"
        r"has no (usable )?wheels?|Distribution not found|No matching distribution found|"
        r"only has wheels for the following platforms?|hash mismatch.*platform", re.I)),
    ("compile-failure", "fail", re.compile(
        r"Failed to build|Building wheel for .* (did not run successfully|failed)|"
        r"error: command '.*(gcc|g\+\+|nvcc|cc|c\+\+)' failed|CMake Error|subprocess-exited-with-error|"
        r"Failed to (build|prepare) .* (wheel|metadata)|ninja: build stopped|No CUDA runtime is found|"
        r"CUDA_HOME environment variable is not set|nvcc: not found|gcc: not found", re.I)),
    ("download-failure", "error", re.compile(
        r"Failed to (download|fetch)|error sending request|Connection (reset|refused|aborted)|"
        r"Read timed out|timed out|ConnectionError|HTTP status (server|client) error|"
        r"\b(403|404|5\d\d)\b.*(Forbidden|Not Found|Server Error|Bad Gateway)|CERTIFICATE_VERIFY_FAILED|"
        r"certificate verify failed|invalid peer certificate|UnknownIssuer|Temporary failure in name resolution|"
        r"Network is unreachable|dns error|hash mismatch|THESE PACKAGES DO NOT MATCH THE HASHES|"
        r"IncompleteRead|unexpected end of file|Could not fetch URL", re.I)),
]
STEP_RE = re.compile(r"^#(\d+) \[([^\]]+)\] (.*)$")
ERR_RE = re.compile(r"^#(\d+) ERROR:? (.*)$")
# BuildKit's own steps (their headers), as opposed to the Dockerfile's `[stage n/m] RUN …`
ENGINE_STEP_RE = re.compile(r"(exporting to image|exporting cache|exporting layers|writing image|naming to|"
                            r"importing cache manifest|resolve image config|load metadata|\[internal\])")


# --------------------------------------------------------------------------- build output


class StepTracker:
    """Follows BuildKit's plain output: which step runs, which one failed."""

    def __init__(self, on_step: Callable[[str], None] | None = None):
        self.titles: dict[str, str] = {}
        self.current = ""
        self.failed: str | None = None
        self.on_step = on_step

    def __call__(self, line: str) -> None:
        line = line.rstrip("\n")
        m = STEP_RE.match(line)
        if m:
            n, pos, text = m.groups()
            if n not in self.titles:
                self.titles[n] = f"[{pos}] {text}"
                self.current = self.titles[n]
                if self.on_step:
                    self.on_step(self.current)
            return
        m = ERR_RE.match(line)
        if m and self.failed is None:
            self.failed = self.titles.get(m.group(1), f"step #{m.group(1)}")


def _engine_step_failed(tail: list[str]) -> bool:
    """Whether the step that failed is BuildKit's own (`#23 exporting to image`, `#1 load build
    definition`) rather than one of the Dockerfile's (`#21 [stage-0 17/18] RUN …`): a failure there
    is the engine's (a layer its storage lost: "stat /var/lib/docker/overlay2/…: no such file"),
    never a verdict on the stack."""
    errs = [m for m in map(ERR_RE.match, tail) if m]
    if not errs:
        return False
    n = errs[-1].group(1)
    # Named, never guessed: a Dockerfile step whose header the tail cut off must stay the stack's.
    return any(ln.startswith(f"#{n} ") and ENGINE_STEP_RE.match(ln[len(n) + 2:]) for ln in tail)


def classify(tail: list[str], *, timed_out: bool = False, rc: int = 1) -> tuple[str, str]:
    """-> (cause, status) from the last lines of a failed build."""
    if timed_out:
        return "timeout", "error"
    text = "\n".join(tail)
    for cause, status, rx in CLASSES[1:]:  # the stack's own failures first...
        if rx.search(text):
            return cause, status
    if CLASSES[0][2].search(text) and not re.search(r"executor failed running|did not complete successfully", text):
        return "daemon-error", "error"  # ...then the engine's, when no RUN step failed
    if _engine_step_failed(tail):
        return "daemon-error", "error"  # BuildKit's own step (exporting to image ...), not the Dockerfile's
    if rc in (125, 126, 127) or not re.search(r"^#\d+ ", text, re.M):
        return "daemon-error", "error"  # the client never got a build going
    return "build-failure", "fail"


def failure_detail(tail: list[str], step: str | None, n: int = 25) -> str:
    # Drop BuildKit's progress noise so the last lines are the tool's own output.
    keep = [ln for ln in tail if not re.match(r"^#\d+ (sha256:|extracting|exporting|\d+\.\d+ \s*$)", ln)]
    where = f"failing step: {step}\n" if step else ""
    return where + "\n".join(keep[-n:])
