"""Which index: the configured default index read without pip (environment, uv's and pip's
files), and the PyTorch index of a variant (public by default, a mirror from the environment or
the matrix)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild import index_config as indexmod
from envbuild.errors import InputError
from envbuild.matrix import load_matrix
from envbuild.paths import default_matrix


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL", "UV_CONFIG_FILE", "UV_NO_CONFIG",
                "PIP_CONFIG_FILE", "VIRTUAL_ENV", "XDG_CONFIG_DIRS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    indexmod.default_index_url.cache_clear()
    yield home
    indexmod.default_index_url.cache_clear()


def test_environment_wins_in_uv_order(clean_env, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://pip.example/simple/")
    assert indexmod.default_index_url() == "https://pip.example/simple"
    indexmod.default_index_url.cache_clear()
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://uv.example/simple")
    assert indexmod.default_index_url() == "https://uv.example/simple"


def test_pip_conf_files_are_read_later_overriding_earlier(clean_env, monkeypatch, tmp_path):
    (clean_env / ".pip").mkdir()
    (clean_env / ".pip" / "pip.conf").write_text("[global]\nindex-url = https://legacy.example/simple\n")
    assert indexmod.default_index_url() == "https://legacy.example/simple"
    indexmod.default_index_url.cache_clear()
    (clean_env / ".config" / "pip").mkdir(parents=True)
    (clean_env / ".config" / "pip" / "pip.conf").write_text("[global]\nindex-url = https://user.example/simple\n")
    assert indexmod.default_index_url() == "https://user.example/simple"
    indexmod.default_index_url.cache_clear()
    env_file = tmp_path / "env.conf"
    env_file.write_text("[install]\nindex-url = https://envfile.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(env_file))
    assert indexmod.default_index_url() == "https://envfile.example/simple"


def test_uv_config_files_come_before_pip_conf(clean_env):
    (clean_env / ".config" / "pip").mkdir(parents=True)
    (clean_env / ".config" / "pip" / "pip.conf").write_text("[global]\nindex-url = https://user.example/simple\n")
    (clean_env / ".config" / "uv").mkdir(parents=True)
    (clean_env / ".config" / "uv" / "uv.toml").write_text(
        '[[index]]\nname = "team"\nurl = "https://team.example/simple"\ndefault = true\n')
    assert indexmod.default_index_url() == "https://team.example/simple"
    indexmod.default_index_url.cache_clear()
    Path("pyproject.toml").write_text('[project]\nname = "x"\n[tool.uv]\nindex-url = "https://project.example/simple"\n')
    assert indexmod.default_index_url() == "https://project.example/simple"


def test_nothing_configured_asks_uv_and_never_imports_pip(clean_env):
    code = ("import sys, builtins; real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    assert not name.startswith('pip'), name\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            "from envbuild.index_config import default_index_url; print(default_index_url())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().startswith("https://") and p.stdout.strip().endswith("/simple")


def test_matrix_names_a_pytorch_index_mirror(tmp_path):
    src = Path(default_matrix()).read_text()
    good = tmp_path / "m.yaml"
    good.write_text(src + '\npytorch_index: "https://mirror.example/whl"\n')
    assert load_matrix(good).pytorch_index == "https://mirror.example/whl"
    assert load_matrix(default_matrix()).pytorch_index is None
    bad = tmp_path / "bad.yaml"
    bad.write_text(src + '\npytorch_index: "file:///srv/whl"\n')
    with pytest.raises(InputError) as e:
        load_matrix(bad)
    assert "pytorch_index" in str(e.value)


# --------------------------------------------------------------------------- the PyTorch-index path


@pytest.fixture(scope="module")
def pytorch_mirror(tmp_path_factory):
    """A local index laid out like the PyTorch index (`<root>/cu128/torch/`, PEP 503 HTML, no upload
    times) serving a real torch wheel: this machine's CPU build of 2.13.0, relabelled +cu128 with
    consistent metadata. torch 2.13.0's default build on the package index is cu130, so cu128 must
    come from the PyTorch index."""
    sys.path.insert(0, str(Path(__file__).parent))
    from local_index import LocalIndex, find_local_wheel, relabel_wheel

    cpu = find_local_wheel("torch-2.13.0+cpu-cp311-*.whl")
    if cpu is None:
        pytest.skip("no torch 2.13.0 CPU wheel in pip's find-links folders")
    d = tmp_path_factory.mktemp("pytorch")
    idx = LocalIndex(d / "index")
    idx.html_roots.add("cu128")
    idx.add("cu128", relabel_wheel(cpu, d, "cpu", "cu128"), uploaded="")
    yield idx
    idx.close()


@pytest.mark.network
@pytest.mark.slow
def test_lock_takes_a_non_default_variant_from_the_pytorch_index(pytorch_mirror, run_cli, isolated_cache, tmp_path):
    root = pytorch_mirror.root_url.replace("http://", "http://envbuild:pt-s3cr3t@")
    out = tmp_path / "locks"
    p = run_cli("lock", "--cuda", "cu128", "--hf", "--torch", "2.13.0", "--verl", "0.6.1", "--platform", "amd64",
                "--out", out, "--json",
                env={"ENVBUILD_CACHE": str(isolated_cache), "ENVBUILD_PYTORCH_INDEX": root})
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads(p.stdout.splitlines()[0])
    assert row["status"] == "ok", row["detail"]
    assert row["torch_index"] == pytorch_mirror.url("cu128")  # redacted: no credentials
    assert row["layers"]["torch"] == {"torch": "2.13.0+cu128"}  # the CPU build pins nothing exactly
    served = pytorch_mirror.files[("cu128", "torch")][0]["sha256"]
    cid = "verl0.6.1-hf-torch2.13.0-cu128-py3.11"
    torch_txt = (out / cid / "torch.txt").read_text()
    assert f"--hash=sha256:{served}" in torch_txt  # the mirror's file, by hash
    assert "GET /cu128/torch/" in pytorch_mirror.requests
    for f in (out / cid).iterdir():
        assert "pt-s3cr3t" not in f.read_text(), f
