"""`envbuild probe` arguments, and the probe package's promise: it runs where envbuild is not
installed (only relative imports, only the standard library at module level)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild import probe_cmd
from envbuild import probe_exec as probe_run
from envbuild.cli import main
from envbuild.errors import EnvbuildError

PROBE = Path(probe_cmd.__file__).resolve().parent / "probe"


def test_module_level_imports_are_stdlib_or_relative():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for py in sorted(PROBE.glob("*.py")):
        tree = ast.parse(py.read_text())
        for node in tree.body:  # module level only; heavy imports live inside functions
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside the probe package
                    continue
                names = [node.module.split(".")[0]]
            else:
                continue
            bad = [n for n in names if n not in stdlib]
            assert not bad, f"{py.name}: module-level import of {bad}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module.startswith("envbuild"):
                raise AssertionError(f"{py.name} imports {node.module}: the probe must not need envbuild")


def test_runs_as_a_copied_package_with_only_the_stdlib(tmp_path):
    shutil.copytree(PROBE, tmp_path / "envbuild_probe")
    # -S: no site-packages at all (no torch, no envbuild): argument parsing and a verdict still work
    r = subprocess.run([sys.executable, "-S", "-m", "envbuild_probe", "--level", "env", "--engine", "hf",
                        "--json", str(tmp_path / "v.json")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    v = json.loads((tmp_path / "v.json").read_text())
    assert r.returncode == 1 and v["status"] == "fail"
    torch_check = next(c for c in v["checks"] if c["name"] == "import-torch")
    assert torch_check["cause"] == "module-missing" and "torch" in torch_check["detail"]


def test_probe_args():
    assert probe_run.probe_args("gpu", "vllm", {"cuda": "12.4", "engine_version": "0.8.4"}) == [
        "--level", "gpu", "--engine", "vllm", "--expect-cuda", "12.4", "--expect-engine-version", "0.8.4"]
    with pytest.raises(EnvbuildError, match="level=.nope."):
        probe_run.probe_args("nope", "vllm", {})
    with pytest.raises(EnvbuildError, match="unknown key"):
        probe_run.probe_args("env", "vllm", {"cdua": "12.4"})


@pytest.mark.parametrize("argv,needle", [
    (["probe"], "give an IMAGE to probe in a container, --here to probe this Python environment"),
    (["probe", "img:tag", "--here"], "or --here, not both"),
    (["probe", "--here", "--cuda", "12"], "--cuda='12'"),
    (["probe", "--here", "--hf", "--engine", "vllm"], "conflicts with --hf"),
    (["probe", "--here", "--timeout", "0"], "--timeout=0.0"),
    (["probe", "--here", "--nproc", "0"], "--nproc=0"),
])
def test_bad_arguments_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("envbuild probe:")


def test_cli_here_writes_verdict(tmp_path, capsys):
    out = tmp_path / "v.json"
    rc = main(["probe", "--here", "--level", "env", "--engine", "hf", "--expect-cuda", "99.9", "--output", str(out)])
    v = json.loads(out.read_text())
    assert rc == 1 and v["status"] == "fail" and v["runner"]["mode"] == "here"
    assert "probe env/hf [here]: fail" in capsys.readouterr().out


def test_image_constants_match_the_package_name():
    assert probe_run.IMAGE_PROBE_DIR.endswith("/" + probe_run.PROBE_MODULE)
    assert probe_run.IMAGE_PROBE_DIR.startswith(probe_run.IMAGE_PROBE_PARENT + "/")


def test_a_relative_python_exe_is_the_users_not_the_probes(run_cli, tmp_path):
    """Issue 50: `probe --here --python-exe venv/bin/python` from the venv's parent folder ran the
    probe in another folder and exited 127 with an empty cause; the path is the user's."""
    exe = Path(sys.executable)
    rel = exe.relative_to(exe.parent.parent)
    out = tmp_path / "v.json"
    p = run_cli("probe", "--here", "--python-exe", rel, "--level", "env", "--engine", "hf", "-o", out,
                cwd=exe.parent.parent)
    assert p.returncode in (0, 1, 3), p.stderr
    v = json.loads(out.read_text())
    assert v["level"] == "env" and v["checks"] and v.get("cause") != ""
    assert not any(c["name"] == "probe-run" and "127" in (c.get("detail") or "") for c in v["checks"])


def test_a_selector_means_what_lock_means():
    """Issue 47: `lock --vllm 0.8.5` locks 0.8.5.post1 (the matrix's one 0.8.5); `probe --vllm 0.8.5`
    expected 0.8.5 and reported a version mismatch against the very image lock built."""
    import argparse

    from envbuild.selector import Selectors

    a = argparse.Namespace(matrix=None, expect_cuda=None, expect_torch=None, expect_engine_version=None,
                           expect_verl=None)
    assert probe_cmd._expect(a, Selectors(engine="vllm", engine_version="0.8.5"))["engine_version"] == "0.8.5.post1"
    assert probe_cmd._expect(a, Selectors(engine="vllm", engine_version="0.8.4"))["engine_version"] == "0.8.4"
    assert probe_cmd._expect(a, Selectors(engine="vllm", engine_version="0.99.0"))["engine_version"] == "0.99.0"
    a.expect_engine_version = "0.8.5"  # said outright: as given
    assert probe_cmd._expect(a, Selectors(engine="vllm", engine_version="0.8.5"))["engine_version"] == "0.8.5"
