"""`envbuild ci github`: writes the nightly (envbuild.workflow builds it as data) and
actionlint's config into a repository, refuses one without the matrix it names, and prints what
a team configures before the first night and what a night costs."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from . import errors
from .errors import InputError
from .fsutil import write_atomic
from .matrix import load_matrix
from .paths import default_matrix
from .workflow import (ACTIONLINT_FILE, ACTIONS, DEFAULT_ARM64_BUILD_RUNNER, DEFAULT_ARM64_GPU_LABELS,
                       DEFAULT_BUILD_RUNNER, DEFAULT_GPU_LABELS, DEFAULT_OUT, DEFAULT_WORKFLOW_MATRIX, WORKFLOW_FILE,
                       out_option, dump_yaml, render_workflow)


def load_pins(path: str) -> dict[str, str]:
    """A pin file: YAML or JSON {"actions/checkout@v5": "<40-hex commit>", ...}."""
    import yaml
    try:
        d = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InputError(path, None, "action pins", path, f"unreadable ({e})") from None
    if not isinstance(d, dict):
        raise InputError(path, None, "action pins", type(d).__name__, "expected {action@tag: commit}")
    known = set(ACTIONS.values())
    for k, v in d.items():
        if k not in known:
            raise InputError(path, None, str(k), v, f"not an action the workflow uses ({', '.join(sorted(known))})")
        if not isinstance(v, str) or not re.fullmatch(r"[0-9a-f]{40}", v):
            raise InputError(path, None, str(k), v, "expected a 40-hex commit")
    return dict(d)


def checklist(m, combos: int, gpu_runners: bool, labels: list[str], install: str) -> list[str]:
    """What a team configures before the first night, and what a night costs."""
    build_min, probe_min = 25, 10  # per image, hosted runner, cold (bench/build_speed.json, quickstart.json)
    hours_build = combos * build_min / 60
    lines = [
        "Before the first night (repository settings):",
        "  secret    ENVBUILD_SIGNING_KEY   the private key the table is signed with (`envbuild keygen`)",
        "  variable  ENVBUILD_PUBKEY        its public half (pubkey.json): what the last table must verify with",
        "  secret    ENVBUILD_RECORD_KEY    the key each job signs its records with (`envbuild keygen --name record`); "
        "another key than the table's, since GPU runners hold it",
        "  variable  ENVBUILD_RECORD_PUBKEY its public half (record.pub.json): publish folds only records it signed",
        "  variable  ENVBUILD_REPOSITORY    optional: where images go (default ghcr.io/<owner>/<repo>)",
        "  variable  ENVBUILD_TABLE_URL     optional: where the table is served (default the Pages URL)",
        f"  variable  ENVBUILD_INSTALL       optional: how jobs install envbuild (default {install!r}, written into "
        "the workflow); if you set it, pin it the same way: "
        f"gh variable set ENVBUILD_INSTALL --body {shlex.quote(install)}",
        "  secrets   ENVBUILD_INDEX_URL, ENVBUILD_PYTORCH_INDEX, ENVBUILD_CA_BUNDLE: optional mirrors and CA",
        "  Pages     Settings > Pages > Source: GitHub Actions",
    ]
    if gpu_runners:
        lines.append(f"  runners   self-hosted GPU runners labelled {', '.join(labels)}: the probe jobs wait for "
                     "them after the first publish (CPU verdicts); a second publish adds the gpu verdicts; probe "
                     "jobs no runner takes are cancelled by the next night (without any runner, generate with "
                     "--gpu-runners none)")
    else:
        lines.append("  runners   none beyond GitHub's hosted ones: the census and the CPU contract level; "
                     "the gpu level is not run")
    lines.append(f"Cost of a full night: {combos} combinations; the census runs first and skips what it "
                 f"condemns; about {hours_build:.0f} runner-hours of builds at ~{build_min} min an image cold"
                 + (f" plus ~{combos * probe_min / 60:.0f} GPU-runner-hours of probes" if gpu_runners else "")
                 + "; far less on nights the registry cache holds the shared layers.")
    return lines



# ---------------------------------------------------------------- CLI


def add_arguments(g) -> None:
    g.add_argument("--out", default=DEFAULT_OUT, help=f"folder taking the place of {DEFAULT_OUT}/ "
                                                      f"(default: {DEFAULT_OUT}, where GitHub runs it from)")
    g.add_argument("--matrix", default=DEFAULT_WORKFLOW_MATRIX,
                   help=f"the repository's matrix YAML the workflow builds and patches (default: {DEFAULT_WORKFLOW_MATRIX})")
    g.add_argument("--runner-label", action="append", dest="runner_labels", metavar="LABEL",
                   help=f"label of the GPU runners for probe jobs, repeatable (default: {', '.join(DEFAULT_GPU_LABELS)})")
    g.add_argument("--build-runner", default=DEFAULT_BUILD_RUNNER,
                   help=f"runner for the build and the other non-GPU jobs; a larger runner for ~8 GB "
                        f"images (default: {DEFAULT_BUILD_RUNNER}, whose build job frees disk first)")
    g.add_argument("--arm64-runner-label", action="append", dest="arm64_runner_labels", metavar="LABEL",
                   help="label of the arm64 GPU runners probing linux/arm64 rows, repeatable "
                        f"(default: {', '.join(DEFAULT_ARM64_GPU_LABELS)})")
    g.add_argument("--arm64-build-runner", default=DEFAULT_ARM64_BUILD_RUNNER,
                   help=f"runner building linux/arm64 rows natively (default: {DEFAULT_ARM64_BUILD_RUNNER})")
    g.add_argument("--install", default=None, metavar="SPEC",
                   help="what jobs `pip install`, pinned to one build: git+https://HOST/PATH@<commit> or a wheel "
                        "URL#sha256=<hash>, written with the `all` extra (default: `.[all]` in envbuild's own "
                        "repository, else this envbuild's git checkout pinned by commit; required when neither); "
                        "vars.ENVBUILD_INSTALL overrides it at run time")
    g.add_argument("--gpu-runners", choices=("yes", "none"), default="yes",
                   help="none: no probe jobs; builds probe env and contract on their CPU (default: yes)")
    g.add_argument("--action-pins", metavar="FILE",
                   help="YAML/JSON {action@tag: commit}: pin the actions used by SHA")
    g.add_argument("--check", action="store_true", help="exit 1 if the file on disk differs (write nothing)")
    g.add_argument("--json", action="store_true",
                   help="print {files, stale (with --check), install, checklist} as JSON instead of the lines")


def run(args) -> int:
    return _run_github(args)


def render_actionlint_config(labels: list[str], out: str) -> str:
    head = ("# generated by envbuild (`envbuild ci github`) - do not edit.\n"
            f"# Check the workflow: actionlint -config-file {Path(out) / ACTIONLINT_FILE} {Path(out) / WORKFLOW_FILE}\n")
    return head + dump_yaml({"self-hosted-runner": {"labels": list(labels)}})


_PINNED_GIT = re.compile(r"^git\+(https|ssh)://[^\s@]+(?:@[^\s@]+)?\.git@[0-9a-f]{40}$|"
                         r"^git\+(https|ssh)://[^\s@]+@[0-9a-f]{40}$")
_WHEEL_BY_HASH = re.compile(r"^(https|file)://\S+\.whl#sha256=[0-9a-f]{64}$")  # a URL: `envbuild[all] @ URL`


# The jobs run every command: envbuild with its `all` extra (the default install is pick's).
EXTRA = "all"
_NAMED = re.compile(r"^envbuild(?:\[[a-z0-9_,\s-]*\])?\s*@\s*")


def with_extra(spec: str) -> str:
    """A pinned spec as the jobs install it: `.[all]`, or `envbuild[all] @ <git or wheel URL>`."""
    if spec in (".", f".[{EXTRA}]"):
        return f".[{EXTRA}]"
    return f"envbuild[{EXTRA}] @ " + _NAMED.sub("", spec)


def check_install(spec: str) -> str:
    """An install spec that can only mean one build of envbuild: `.` (envbuild's own repository),
    git+https/ssh pinned by a 40-hex commit, or a wheel pinned by its sha256 (each may be given as
    `envbuild[...] @ …`), returned with the `all` extra the jobs need. A bare name
    (`envbuild==0.1.0`) is refused: envbuild is not published under that name on the package index,
    so whoever registers it would run code in every adopter's nightly, with their secrets."""
    s = spec.strip()
    bare = _NAMED.sub("", s)
    if s in (".", f".[{EXTRA}]") or _PINNED_GIT.match(bare) or _WHEEL_BY_HASH.match(bare):
        return with_extra(s)
    raise InputError("command line", None, "--install", spec,
                     "not pinned to one build: use git+https://HOST/PATH@<40-hex commit> or "
                     "URL/envbuild-X-py3-none-any.whl#sha256=<64 hex> (a bare name on the index is not envbuild's)")


def _default_install() -> str:
    """`.` where this repository is envbuild itself, else this envbuild's own source pinned by
    commit (git+URL@<commit>, when it runs from a git checkout with an https/ssh origin); None when
    neither can be said: then `--install` is required."""
    try:
        text = Path("pyproject.toml").read_text()
    except OSError:
        text = ""
    if re.search(r'(?m)^name\s*=\s*"envbuild"', text):
        return with_extra(".")
    src = Path(__file__).resolve().parent.parent

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    url, head, dirty = git("config", "--get", "remote.origin.url"), git("rev-parse", "HEAD"), \
        git("status", "--porcelain", "--untracked-files=no")
    if re.match(r"^(https|ssh)://", url) and re.fullmatch(r"[0-9a-f]{40}", head) and not dirty:
        return with_extra(f"git+{url}@{head}")
    return None


def _run_github(args) -> int:
    mpath = Path(args.matrix)
    if not mpath.is_file():
        # The workflow builds the repository's own matrix: refuse to write one that names a file
        # the repository does not have (it fails on the runner, not here).
        raise InputError("command line", None, "--matrix", args.matrix,
                         f"no matrix there in this repository; copy one (envbuild's: {default_matrix()}) "
                         "or name yours with --matrix PATH")
    m = load_matrix(mpath)
    labels = args.runner_labels or list(DEFAULT_GPU_LABELS)
    arm_labels = args.arm64_runner_labels or list(DEFAULT_ARM64_GPU_LABELS)
    for lb in labels + arm_labels + [args.build_runner, args.arm64_build_runner]:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", lb):
            raise InputError("command line", None, "--runner-label", lb, "not a runner label")
    custom = list(dict.fromkeys(labels + (arm_labels if "linux/arm64" in m.platforms else [])))
    install = check_install(args.install) if args.install else _default_install()
    if install is None:
        raise InputError("command line", None, "--install", "",
                         "required here: say which envbuild the nightly installs, pinned (git+https://HOST/PATH@"
                         "<40-hex commit> or a wheel URL#sha256=<hash>); envbuild is not on the package index")
    gpu = args.gpu_runners != "none"
    pins = load_pins(args.action_pins) if args.action_pins else {}
    opt = out_option(args.out) + ("" if args.matrix == DEFAULT_WORKFLOW_MATRIX else f" --matrix {args.matrix}") \
        + (f" --install {args.install}" if args.install else "") + ("" if gpu else " --gpu-runners none") \
        + (f" --action-pins {args.action_pins}" if args.action_pins else "")
    files = {Path(args.out) / WORKFLOW_FILE: render_workflow(m, args.matrix or "", args.out, labels, args.build_runner,
                                                             arm_labels, args.arm64_build_runner, install, gpu,
                                                             pins, opt),
             Path(args.out) / ACTIONLINT_FILE: render_actionlint_config(custom, args.out)}
    as_json = getattr(args, "json", False)
    if args.check:
        stale = [p for p, text in files.items() if (p.read_text() if p.is_file() else None) != text]
        if as_json:
            print(json.dumps({"files": [str(p) for p in files], "stale": [str(p) for p in stale], "install": install}))
        for p in stale:
            print(f"{p}: stale; regenerate with `envbuild ci github{out_option(args.out)}`", file=sys.stderr)
        if not stale and not as_json:
            print(" ".join(map(str, files)) + ": up to date")
        return errors.VERDICT if stale else errors.OK  # a failed check, as a regression is
    for p, text in files.items():
        write_atomic(p, text)
    from .expand import plan
    lines = checklist(m, len(plan(m).combos), gpu, labels, install)
    if as_json:
        print(json.dumps({"files": [str(p) for p in files], "install": install, "checklist": lines}, indent=2))
        return errors.OK
    for p in files:
        print(p)
    for line in lines:
        print(line, file=sys.stderr)
    return errors.OK
