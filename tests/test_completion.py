"""`envbuild completion`, `envbuild --version` and a closed stdout pipe: the CLI's first-hour edges."""

import subprocess
import sys

import pytest

from envbuild import __version__
from envbuild.cli import build_parser
from envbuild.completion import commands, fish_script
from envbuild.matrix import load_matrix
from envbuild.paths import default_matrix


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory):
    p = subprocess.run([sys.executable, "-m", "envbuild", "completion", "bash"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    f = tmp_path_factory.mktemp("compl") / "envbuild.bash"
    f.write_text(p.stdout)
    return f


def complete(script, line: str) -> list[str]:
    """What bash's completion offers for `line` (the word under the cursor is the last one)."""
    words = line.split(" ")
    arr = " ".join(f"'{w}'" for w in words)
    prog = (f"source {script}; COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; _envbuild; "
            'printf "%s\\n" "${COMPREPLY[@]}"')
    p = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return [w for w in p.stdout.splitlines() if w]


def test_bash_completes_commands_flags_and_matrix_values(bash_script):
    m = load_matrix(default_matrix())
    assert {"plan", "build", "pick", "doctor", "completion"} <= set(complete(bash_script, "envbuild "))
    assert complete(bash_script, "envbuild pi") == ["pick"]
    assert complete(bash_script, "envbuild plan --cu") == ["--cuda"]
    assert complete(bash_script, "envbuild build --cuda ") == list(m.cuda)
    assert complete(bash_script, "envbuild pick --vllm 0.8") == [v for v in m.engines["vllm"] if v.startswith("0.8")]
    assert complete(bash_script, "envbuild lock --verl ") == m.verl
    assert "2.6.0" in complete(bash_script, "envbuild plan --torch ")  # from the engines' pins, via the plan
    assert complete(bash_script, "envbuild probe --level ") == ["env", "contract", "gpu"]
    assert complete(bash_script, "envbuild base ") == ["bootstrap"]
    assert complete(bash_script, "envbuild completion ") == ["bash", "zsh", "fish"]
    assert complete(bash_script, "envbuild doctor --config ") == []  # a path: the shell's file completion


def test_fish_and_zsh_scripts_cover_every_command():
    cmds = commands(build_parser())
    fish = fish_script(cmds)
    for c in cmds:
        assert f"-a {c.name} -d" in fish
    assert "complete -c envbuild -n '__fish_seen_subcommand_from build' -l cuda -x -a 'cu121" in fish
    p = subprocess.run([sys.executable, "-m", "envbuild", "completion", "zsh"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "autoload -U +X bashcompinit && bashcompinit" in p.stdout
    assert "complete -o default -F _envbuild envbuild" in p.stdout


def test_version_names_package_matrix_and_probe(run_cli):
    p = run_cli("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"envbuild {__version__}; matrix schema 1 (verl.yaml sha256:")
    assert "probe verdict schema 1" in p.stdout


def test_closed_pipe_is_quiet():
    p = subprocess.Popen([sys.executable, "-m", "envbuild", "plan", "--all"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.stdout.close()  # `| head -1`
    err = p.stderr.read()
    rc = p.wait(timeout=120)
    assert first.startswith("ID") and "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc in (0, 141)
