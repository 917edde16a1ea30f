"""`envbuild --version`: the package version, and the versions of what a verdict depends on.

The matrix (its schema and a digest of the bundled file) and the probe (its verdict schema and a digest
of its code) decide what a table says as much as the package does, so a bug report needs all three.
Computed only when --version is asked for: the CLI's start-up does not pay for it.
"""

from __future__ import annotations

import argparse
import hashlib


def version_text() -> str:
    from . import __version__
    from .paths import default_matrix
    from .probe.verdict import SCHEMA as VERDICT_SCHEMA
    from .yamlsafe import load

    mpath = default_matrix()
    data, _ = load(mpath)
    matrix = f"matrix schema {data.get('schema', 1)} ({mpath.name} sha256:{hashlib.sha256(mpath.read_bytes()).hexdigest()[:12]})"
    probe = f"probe verdict schema {VERDICT_SCHEMA}"
    try:
        from .probe_exec import probe_code_hash  # the probe's code digest, as reuse keys use it
    except ImportError:
        pass
    else:
        probe += f" (code sha256:{probe_code_hash()[:12]})"
    return f"envbuild {__version__}; {matrix}; {probe}"


class VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print the package, matrix and probe versions and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()
