"""The `envbuild` command line.

Each subcommand lives in its own module, which provides `add_arguments(parser)` and
`run(args) -> int`; this file only wires them together. Modules keep their heavy imports
inside functions so `envbuild --help` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import sys
import threading
import time

from .about import VersionAction
from .errors import BAD_INPUT, BROKEN_PIPE, INTERRUPTED, EnvbuildError, MissingDependency

# name -> (module, one-line help). One table; order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("envbuild.plan", "expand and filter the matrix"),
    "lock": ("envbuild.lock_cmd", "resolve hash-pinned, era-consistent locks per combination"),
    "render": ("envbuild.render_cmd", "render one Dockerfile per combination"),
    "base": ("envbuild.base_cmd", "build base images (bootstrap: debootstrap + docker import)"),
    "build": ("envbuild.build", "lock, render, build (BuildKit), probe and record combinations"),
    "probe": ("envbuild.probe_cmd", "run the probe in an image, here, or across a Ray cluster"),
    "census": ("envbuild.census", "judge every combination without an image: its lock, and verl against the engine's wheels"),
    "wheelhouse": ("envbuild.wheelhouse_cmd", "download exactly the files of a row's lock (for a node without Docker)"),
    "venv": ("envbuild.venv_cmd", "install a row's lock offline from a wheelhouse into a venv, checked"),
    "keygen": ("envbuild.keygen_cmd", "make an Ed25519 key pair for signing tables"),
    "publish": ("envbuild.publish_cmd", "fold result records into the signed compatibility table"),
    "verify": ("envbuild.verify", "verify a signed table"),
    "attach": ("envbuild.attach", "sign and attach test results, SBOM and provenance to pushed image digests"),
    "pick": ("envbuild.pick", "print the best verified image for a selection"),
    "diff": ("envbuild.diff_cmd", "compare two tables; exit 1 on regressions"),
    "discover": ("envbuild.discover", "find upstream releases newer than the matrix"),
    "ci": ("envbuild.ci", "generate CI (GitHub Actions workflow, docker-bake.json)"),
    "doctor": ("envbuild.doctor", "check a verl training config and environment before a run"),
    "completion": ("envbuild.completion", "print a bash, zsh or fish completion script"),
}


def build_parser(only: str | None = None, lazy: bool = False) -> argparse.ArgumentParser:
    """`only`: import just that command's module (the others' imports cost ~0.1-0.3 s). `lazy`:
    import none (the top-level --help lists the commands from the table, so it works whatever
    optional dependency is missing)."""
    parser = argparse.ArgumentParser(prog="envbuild", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, helptext) in COMMANDS.items():
        if only and name != only:
            continue
        if lazy:
            sub.add_parser(name, help=helptext, description=helptext)
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:
                continue  # command not built yet
            raise MissingDependency(name, e.name or "?") from None
        p = sub.add_parser(name, help=helptext, description=helptext)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


INTERRUPT_GRACE_S = 0.5  # ^C: how long work still running in threads may take to end


def _interrupted(command: str, this_process: bool) -> int:
    """^C stops within a second. Work still running in threads (a resolution, a scan of verl)
    would hold the exit until it ends, as Python joins worker threads at exit; what is done is
    written already (records, locks and tables are written whole or not at all), so the command's
    own process ends after a short grace. A caller that passed argv (a test) gets the code back."""
    print(f"envbuild {command}: interrupted", file=sys.stderr)
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for t in busy:
        t.join(max(0.0, deadline - time.monotonic()))
    if this_process and any(t.is_alive() for t in busy):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    return INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    this_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    # Only the command asked for is imported; completion walks every command, so it gets them all.
    one = argv[0] if argv and argv[0] in COMMANDS and argv[0] != "completion" else None
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        hint = difflib.get_close_matches(argv[0], list(COMMANDS), n=1)
        print(f"envbuild: unknown command {argv[0]!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
              + f"; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return BAD_INPUT
    # No command named (--help, --version, nothing): list the commands without importing any.
    lazy = one is None and not (argv and argv[0] == "completion")
    try:
        parser = build_parser(one, lazy=lazy)
    except MissingDependency as e:
        print(f"envbuild: {e}", file=sys.stderr)
        return BAD_INPUT
    parser.set_defaults(_parser=parser)
    args, extra = _parse(parser, argv)
    if extra:
        return _unknown_flags(parser, args, extra)
    if not getattr(args, "_run", None):
        parser.print_help()
        return BAD_INPUT
    try:
        rc = int(args._run(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not in a traceback at exit
        return rc
    except BrokenPipeError:  # `envbuild plan --all | head -1`: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE  # what the shell reports for such a tool
    except EnvbuildError as e:
        print(f"envbuild {args.command}: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # a reader of --json output gets the error in its own shape
            print(json.dumps({"error": {"command": args.command, "message": str(e), "exit_code": e.exit_code}}))
        return e.exit_code
    except KeyboardInterrupt:
        return _interrupted(args.command, this_process)
    except OSError as e:  # a file-system error no module named: one line, infrastructure
        from .errors import INFRA  # noqa: F811 - the exit code of infrastructure
        print(f"envbuild {args.command}: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}",
              file=sys.stderr)
        return INFRA


def _parse(parser, argv: list[str]):
    """argparse, except that everything after the first `--` goes to a command that takes it
    (`_passthrough`: the name of its list, doctor's overrides) also when a positional came first:
    `envbuild doctor run.sh -- key=value` (argparse alone stops at the second positional run)."""
    if "--" in argv:
        i = argv.index("--")
        args, extra = parser.parse_known_args(argv[:i])
        name = getattr(args, "_passthrough", None)
        if name:
            setattr(args, name, list(getattr(args, name) or []) + argv[i + 1:])
            return args, extra
    return parser.parse_known_args(argv)


def _unknown_flags(parser, args, extra: list[str]) -> int:
    """argparse would print the top-level usage for a subcommand's typo: name the flag, suggest."""
    sub = None
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        sub = action.choices.get(getattr(args, "command", None) or "")
    known = [o for a in (sub or parser)._actions for o in a.option_strings]
    flags = [x.split("=", 1)[0] for x in extra if x.startswith("-")]
    parts = []
    for f in flags or extra[:1]:
        hint = difflib.get_close_matches(f, known, n=1)
        parts.append(f"unknown {'flag' if f.startswith('-') else 'argument'} {f!r}"
                     + (f" (did you mean {hint[0]}?)" if hint else ""))
    where = f"envbuild {args.command}" if getattr(args, "command", None) else "envbuild"
    print(f"{where}: " + "; ".join(parts), file=sys.stderr)
    print((sub or parser).format_usage().rstrip(), file=sys.stderr)
    return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
