"""Packaging as a user meets it: sdist -> wheel (built from the sdist, not the tree) -> a fresh
venv without pip -> `envbuild plan` works, finds its bundled data, and writes no state into
site-packages."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _uv() -> str:
    from envbuild.index_config import uv_exe  # the uv envbuild itself runs (a dependency)

    return uv_exe()


@pytest.mark.slow
@pytest.mark.network
def test_sdist_builds_a_wheel_that_runs_in_a_venv_without_pip(tmp_path):
    uv = _uv()
    dist = tmp_path / "dist"
    p = subprocess.run([uv, "build", "--sdist", "--out-dir", str(dist), str(ROOT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    (sdist,) = dist.glob("envbuild-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    assert any(n.endswith("/matrix/verl.yaml") for n in names) and any(n.endswith("/dockerfiles/Dockerfile.j2") for n in names)
    # the wheel from the sdist (what pip does with an sdist from an index)
    p = subprocess.run([uv, "build", "--wheel", "--out-dir", str(dist), str(sdist)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = dist.glob("envbuild-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = venv / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import pip"], capture_output=True).returncode != 0  # really pip-less
    p = subprocess.run([uv, "pip", "install", "-q", "--python", str(py), f"{wheel}[all]"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]

    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_DATA_HOME": str(home / ".local/share"), "VIRTUAL_ENV": str(venv)}
    env.pop("ENVBUILD_CACHE", None)
    site = Path(subprocess.run([str(py), "-c", "import envbuild, os; print(os.path.dirname(envbuild.__file__))"],
                               capture_output=True, text=True, check=True, env=env, cwd=tmp_path).stdout.strip())
    assert str(venv) in str(site)
    before = {q for q in site.rglob("*") if "__pycache__" not in q.parts}
    out = subprocess.run([str(venv / "bin" / "envbuild"), "plan", "--cuda", "12.4", "--vllm", "0.8.4", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert '"torch": "2.6.0"' in out.stdout and "Traceback" not in out.stderr
    # the nightly's step scripts ship in the wheel: `ci github` writes a workflow from an install
    # (in a repository holding a matrix, as a team's does)
    (tmp_path / "matrix").mkdir()
    (tmp_path / "matrix" / "verl.yaml").write_bytes((site / "_data" / "matrix" / "verl.yaml").read_bytes())
    out = subprocess.run([str(venv / "bin" / "envbuild"), "ci", "github", "--out", str(tmp_path / "gh"),
                          "--install", "https://example.invalid/envbuild-1.0-py3-none-any.whl#sha256=" + "0" * 64],
                         capture_output=True,
                         text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0 and "envbuild ci earlier" in (tmp_path / "gh" / "workflows" / "envbuild-nightly.yml").read_text(), \
        out.stderr[-2000:]
    # state goes to the user's dirs, never into the installed package
    out = subprocess.run([str(venv / "bin" / "envbuild"), "plan", "--cuda", "cu124", "--vllm", "0.8.4", "--verl", "0.4.1",
                          "--refresh-metadata"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert (home / ".local/share/envbuild/metadata.json").is_file()
    after = {q for q in site.rglob("*") if "__pycache__" not in q.parts}
    assert after == before


def test_every_distribution_imported_at_module_level_is_declared():
    """What builder/ imports at the top of a module (outside the probe, which runs in images
    with the stack's own packages) is a declared dependency (issue 28: `requests` was not)."""
    import ast
    import importlib.metadata as md
    import re
    import sys

    root = Path(__file__).resolve().parent.parent
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["all"]  # the default's and every command's
    declared = {re.split(r"[<>=!\[ ;]", d.strip())[0].lower().replace("_", "-") for d in deps}
    dists = md.packages_distributions()
    tops = set()
    for p in (root / "builder").rglob("*.py"):
        if "probe" in p.relative_to(root / "builder").parts:
            continue
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops.add(node.module.split(".")[0])
    third = {t for t in tops if t not in sys.stdlib_module_names and t not in ("envbuild", "__future__")}
    missing = {t: dists.get(t) for t in third
               if not any(d.lower().replace("_", "-") in declared for d in dists.get(t, [t]))}
    assert third and missing == {}, missing


def test_pick_and_verify_need_only_packaging_and_securesystemslib(tmp_path):
    """The default install (`pip install 'CLONE[pick]'`: packaging and securesystemslib[crypto]):
    pick and verify import nothing else. The other dependencies are
    blocked in a child process, which then picks from the committed H200 evidence table."""
    root = Path(__file__).resolve().parent.parent
    table = root / "bench" / "h200_rows" / "table"
    code = f"""
import sys
BLOCKED = {{"uv", "oras", "omegaconf", "hydra", "rich", "jinja2", "yaml", "requests", "jsonschema"}}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked for this test: " + name)
sys.meta_path.insert(0, Block())
from envbuild.cli import main
assert main(["verify", {str(table)!r}, "--pubkey", {str(table / 'pubkey.json')!r}]) == 0
assert main(["pick", "--hf", "--verl", "0.9.1", "--in-place", "--table", {str(table)!r},
             "--pubkey", {str(table / 'pubkey.json')!r}]) == 0
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ENVBUILD_STATE": str(tmp_path / "state"), "ENVBUILD_CONFIG": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr[-2000:]


def test_help_imports_no_command_and_a_missing_dependency_is_one_line(tmp_path):
    """Issue 50: `envbuild --help` lists the commands without importing them (the pick-only install
    has no PyYAML); a command that needs what is missing says so in one line, exit 2."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"uv", "oras", "omegaconf", "hydra", "rich", "jinja2", "yaml", "requests"}:
            raise ModuleNotFoundError("blocked for this test: " + name, name=name)
sys.meta_path.insert(0, Block())
from envbuild.cli import main
sys.exit(main(sys.argv[1:]))
"""
    help_ = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "census" in help_.stdout and "pick" in help_.stdout, help_.stderr
    plan = subprocess.run([sys.executable, "-c", code, "plan"], capture_output=True, text=True, timeout=60)
    assert plan.returncode == 2 and "Traceback" not in plan.stderr
    assert plan.stderr.strip().count("\n") == 0 and "needs PyYAML" in plan.stderr


@pytest.mark.network
def test_the_readmes_pick_only_install_line_installs_what_pick_and_verify_run_on(tmp_path):
    """Issue 50: the README's pick-only line, as written (read from the README, the clone's path
    put in), into a fresh venv from the package index: exactly pick's distributions are installed,
    pick and verify answer from a signed table, --help lists every command, and a build command
    says in one line which dependency it lacks and names the `all` extra."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text()
    line = re.search(r"`(pip install 'CLONE\[pick\]')`", text).group(1)
    argv = shlex.split(line)
    uv = _uv()
    dist = tmp_path / "dist"
    p = subprocess.run([uv, "build", "--wheel", "--out-dir", str(dist), str(ROOT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = dist.glob("envbuild-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    packages = [a.replace("CLONE", str(wheel)) for a in argv[2:]]  # after `pip install`
    p = subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    env = {**os.environ, "ENVBUILD_STATE": str(tmp_path / "state"), "ENVBUILD_CONFIG": str(tmp_path / "config")}
    table = ROOT / "bench" / "h200_rows" / "table"

    def run(*args):
        return subprocess.run([str(venv / "bin" / "envbuild"), *map(str, args)], capture_output=True, text=True,
                              env=env, cwd=tmp_path)

    assert run("verify", table, "--pubkey", table / "pubkey.json").returncode == 0
    p = run("pick", "--hf", "--verl", "0.9.1", "--in-place", "--table", table, "--pubkey", table / "pubkey.json")
    assert p.returncode == 0 and "verl0.9.1-hf" in p.stdout, p.stderr
    p = run("--help")
    assert p.returncode == 0 and all(c in p.stdout for c in ("pick", "verify", "build", "doctor"))
    p = run("plan", "--vllm", "0.8.4")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "envbuild[all]" in p.stderr
    # nothing of the build side came with it
    listed = subprocess.run([uv, "pip", "list", "--python", str(venv / "bin" / "python"), "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert not names & {"pyyaml", "jinja2", "rich", "uv", "oras", "omegaconf", "hydra-core", "requests"}, names


@pytest.mark.network
def test_the_readmes_offline_node_install_runs_venv_and_probe(tmp_path):
    """Issue 50: the README's three lines that put envbuild onto an offline GPU node, as written
    (read from the README; this Python's version for the node's, paths put in): wheels gathered
    with the index, installed with none, and the node's commands (`venv`, `probe --here`) run;
    nothing of the build side came with them."""
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(pip wheel --no-deps -w ENVWH CLONE.*?)```", text, re.S).group(1)
    lines = [re.sub(r"\s+# .*$", "", ln) for ln in block.strip().splitlines()]
    assert len(lines) == 3 and "--no-index" in lines[2]
    py = "%d.%d" % sys.version_info[:2]
    sub = {"ENVWH": str(tmp_path / "envwh"), "CLONE": str(ROOT), "EB": str(tmp_path / "eb"), "3.12": py,
           "pip ": f"{sys.executable} -m pip ", "python3 -m venv": f"{sys.executable} -m venv"}
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for i, line in enumerate(lines):
        for a, b in sub.items():
            line = line.replace(a, b)
        if i == 2:
            line = line.replace(f"{tmp_path / 'eb'}/bin/{sys.executable} -m pip ", f"{tmp_path / 'eb'}/bin/pip ")
            env = {k: v for k, v in env.items() if not k.startswith(("PIP_INDEX", "PIP_EXTRA"))}
        p = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, (line, p.stderr[-2000:])
    eb = tmp_path / "eb" / "bin"
    listed = subprocess.run([str(eb / "python"), "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, check=True).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert {"envbuild", "packaging", "pyyaml", "securesystemslib"} <= names
    assert not names & {"jinja2", "rich", "uv", "oras", "omegaconf", "hydra-core", "requests"}, names
    state = {"ENVBUILD_STATE": str(tmp_path / "state"), "ENVBUILD_CONFIG": str(tmp_path / "config")}
    for args in (["venv", "--help"], ["probe", "--here", "--level", "env", "--engine", "hf",
                                      "--output", str(tmp_path / "v.json")]):
        p = subprocess.run([str(eb / "envbuild"), *args], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **state}, cwd=tmp_path)
        assert p.returncode in (0, 1, 3) and "Traceback" not in p.stderr and "envbuild[all]" not in p.stderr, \
            (args, p.stderr[-2000:])
    assert json.loads((tmp_path / "v.json").read_text())["level"] == "env"
