"""The README's opening example and ci/quickstart.sh: every command as shown is one the CLI accepts, and
the quickstart trusts only the key it generated."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from envbuild.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def opening_example() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```console\n(.*?)```", text, re.S).group(1)
    cmds, cur = [], ""
    for line in block.splitlines():
        if line.startswith("$ "):
            cur = line[2:]
        elif cur and line.startswith("      "):
            cur += " " + line.strip()
        else:
            continue
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        cmds.append(shlex.split(cur, comments=True))
        cur = ""
    return cmds


def test_readme_opening_example_is_build_publish_pick_with_the_key():
    cmds = opening_example()
    assert [c[1] for c in cmds] == ["keygen", "build", "publish", "pick"]
    parser = build_parser()
    for argv in cmds:
        assert argv[0] == "envbuild"
        args = parser.parse_args(argv[1:])  # exits (SystemExit) on a flag the CLI does not have
        assert args.command == argv[1]
        assert not [k for k, v in vars(args).items() if k.startswith("deprecated_") and v is not None], argv
    keygen, build, publish, pick = (build_parser().parse_args(c[1:]) for c in cmds)
    assert build.push and build.repository == "127.0.0.1:5000" and build.results == publish.results
    assert Path(publish.key).parent == Path(keygen.out) and Path(pick.pubkey).parent == Path(keygen.out)
    assert pick.table == publish.out


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed (ci/test.sh installs it)")
def test_quickstart_passes_shellcheck():
    p = subprocess.run(["shellcheck", str(ROOT / "ci" / "quickstart.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_quickstart_uses_its_own_venv_and_its_own_key():
    def code(name):
        text = (ROOT / "ci" / name).read_text()
        return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))

    venv = code("venv.sh")  # the README's two commands share it
    assert "-m venv .venv" in venv and ".venv/bin/python -m pip install" in venv
    for name in ("venv.sh", "quickstart.sh", "test.sh"):  # never the system Python's pip
        assert "python3 -m pip" not in code(name), name
    assert "bash ci/venv.sh" in code("quickstart.sh") and "bash ci/venv.sh test" in code("test.sh")
    code = code("quickstart.sh")
    # verify and pick name the key keygen wrote, never the pubkey.json lying next to the table
    for cmd in ("envbuild verify", "envbuild pick"):
        line = next(ln for ln in code.splitlines() if ln.strip().startswith(cmd))
        assert "--pubkey keys/envbuild.pub.json" in line and "table/pubkey" not in line
