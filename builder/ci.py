"""`envbuild ci ACTION`: CI generated from the matrix, and the steps its jobs run.

Each action lives in its own module with `add_arguments(parser)` and `run(args) -> int`, named
in one table (as the top-level commands are in envbuild.cli): only the chosen one is imported.
"""

from __future__ import annotations

import importlib

from .errors import UsageError

# name -> (module, one-line help). One table; order is the order shown in --help.
ACTIONS: dict[str, tuple[str, str]] = {
    "github": ("envbuild.ci_github", "write the GitHub Actions nightly (.github/workflows/envbuild-nightly.yml) "
                                    "and actionlint's config"),
    "bake": ("envbuild.bake", "write docker-bake.json for the plan"),
    "matrix": ("envbuild.ci_matrix", "print the plan as {\"include\": [...]} for strategy.matrix"),
    "probe": ("envbuild.ci_probe", "probe the recorded images of the selected combinations here, one record "
                                   "per image (the GPU runners' step)"),
    "earlier": ("envbuild.ci_earlier", "take the last published night's records (and earlier tables) as far as "
                                       "its signed table vouches for them: the nightly folds tonight onto these"),
    "sign-records": ("envbuild.ci_sign", "sign the records this job wrote (RESULTS/signatures/JOB.dsse.json): "
                                         "publish --signed-records folds only signed ones"),
    "notify": ("envbuild.notify", "open, update and close one GitHub issue per broken combination (tonight's "
                                  "table against the last published one); exit 1 on a regression"),
    "torch-index": ("envbuild.ci_index", "print the PyTorch index URL of an accelerator variant (the build's "
                                         "torch-index secret)"),
}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="ci_command", metavar="ACTION")
    for name, (modname, helptext) in ACTIONS.items():
        sp = sub.add_parser(name, help=helptext, description=helptext)
        mod = importlib.import_module(modname)
        mod.add_arguments(sp)
        sp.set_defaults(_ci_run=mod.run)


def run(args) -> int:
    fn = getattr(args, "_ci_run", None)
    if fn is None:
        raise UsageError("expected an action: " + ", ".join(ACTIONS) + " (envbuild ci --help)")
    return fn(args)
