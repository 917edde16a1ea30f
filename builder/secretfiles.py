"""Secret values (index URLs with credentials, a CA bundle path) as files for BuildKit's
`--secret id=..,src=..`: private, removed on every exit path, and swept up after a kill -9."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Iterator

from .scratch import _alive, scratch_dir

SECRETS_PREFIX = "envbuild-secrets-"


def clean_stale_secrets(tmp: str | None = None) -> list[str]:
    """Remove secret folders left by a killed run (kill -9 skips every `finally`): each folder
    names the process that made it, so one whose process is gone is stale."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    for name in os.listdir(tmp):
        m = re.fullmatch(re.escape(SECRETS_PREFIX) + r"(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
            removed.append(name)
    return removed


@contextlib.contextmanager
def secret_files(values: dict[str, str]) -> Iterator[dict[str, str]]:
    """Write secret strings (index URLs with credentials) to 0600 files in a private temp
    folder for `--secret id=..,src=..`; removed afterwards, on every exit path Python sees
    (errors, Ctrl-C, SIGTERM, which `build` turns into Ctrl-C); a folder a kill -9 left behind
    is removed by the next run (clean_stale_secrets)."""
    clean_stale_secrets()
    with scratch_dir(SECRETS_PREFIX) as d:  # listed in the state dir: swept whatever TMPDIR says
        out = {}
        for sid, val in values.items():
            p = os.path.join(d, sid)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(val)
            out[sid] = p
        yield out


