"""`envbuild discover`: proposals from index releases, as a patch that applies and plans."""

import json
import shutil
import subprocess

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from envbuild.discover import discover, patch_path, patch_text, run_discovery
from envbuild.index import Metadata
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.paths import default_matrix


class FakeMeta:
    """Unit-test stand-in for envbuild.index.Metadata: a few releases and their pins."""

    VERSIONS = {"verl": ["0.4.1", "0.5.0", "0.6.0rc1", "0.6.0"], "vllm": ["0.8.4", "0.9.0", "0.9.1", "0.10.0"],
                "sglang": ["0.4.6.post5"], "torch": ["2.6.0", "2.7.0", "2.7.1", "2.8.0.dev1"]}
    PINS = {("vllm", "0.8.4"): "2.6.0", ("vllm", "0.9.0"): "2.7.0", ("vllm", "0.9.1"): "2.7.0",
            ("vllm", "0.10.0"): "2.7.1", ("sglang", "0.4.6.post5"): "2.6.0"}
    DEFAULT_CUDA = {"2.6.0": "cu124", "2.7.0": "cu126", "2.7.1": "cu126"}

    def versions(self, name):
        return list(self.VERSIONS[name])

    def torch_pin(self, eng, v):
        return self.PINS.get((eng, v))

    def default_cuda(self, t):
        return self.DEFAULT_CUDA[t]

    def requires_python(self, name, v):
        return ">=3.9"

    def requires(self, name, v, extras=()):
        assert (name, v) == ("verl", "0.6.0")
        reqs = ['vllm>=0.8.5,<=0.9.1; extra == "vllm"', 'sglang==0.4.6.post5; extra == "sglang"']
        return [r for r in map(Requirement, reqs) if r.marker.evaluate({"extra": extras[0] if extras else ""})]


MATRIX = """\
schema: 1
python: ["3.11"]
cuda:
  cu124: {toolkit: "12.4", base: "nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", glibc: "2.35", torch: ">=2.4,<2.7"}
  cu126: {toolkit: "12.6", base: "nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04", glibc: "2.35", torch: ">=2.6"}
engines:
  vllm:
    - "0.8.4"   # block style on purpose
  sglang: ["0.4.6.post5"]
verl: ["0.4.1", "0.5.0"]
"""


def test_proposals_follow_pins_and_patch_plans(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    m, meta = load_matrix(path), FakeMeta()
    props = {(p.package, p.version): p for p in discover(m, meta)}
    # verl 0.6.0 (not the rc); its [vllm] range picks vLLM 0.9.1, its sglang pin is known.
    assert ("verl", "0.6.0") in props and ("verl", "0.6.0rc1") not in props
    assert "its [vllm] extra asks for vllm 0.9.1" in props[("verl", "0.6.0")].notes
    # vLLM: one per torch pin (0.9.1 newest on 2.7.0, 0.10.0 on 2.7.1); 0.9.0 is not proposed.
    assert ("vllm", "0.9.0") not in props
    p = props[("vllm", "0.10.0")]
    assert (p.torch, p.default_cuda, p.cuda) == ("2.7.1", "cu126", ["cu126"])  # cu124 stops at <2.7
    assert props[("vllm", "0.9.1")].torch == "2.7.0"
    assert ("torch", "2.8.0.dev1") not in props and ("torch", "2.7.1") in props
    new_text, diff = patch_text(m, list(props.values()))
    assert '    - "0.8.4"   # block style on purpose\n    - "0.9.1"\n    - "0.10.0"\n' in new_text
    assert 'verl: ["0.4.1", "0.5.0", "0.6.0"]' in new_text
    assert diff.startswith("--- a/") and "+verl:" in diff
    # The patch applies with patch(1) and the result plans the new combinations.
    if shutil.which("patch"):
        (tmp_path / "p.diff").write_text(diff)
        subprocess.run(["patch", "-s", str(path), str(tmp_path / "p.diff")], check=True)
        assert path.read_text() == new_text
    ids = {c.id for c in plan(load_matrix(path), meta=meta).combos}
    assert "verl0.6.0-vllm0.10.0-torch2.7.1-cu126-py3.11" in ids
    assert not any("vllm0.10.0" in i and "cu124" in i for i in ids)


def _git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not shutil.which("git"), reason="git not installed")
def test_written_patch_applies_with_git(tmp_path, monkeypatch):
    """`discover --write` output names the matrix relative to its repository (a/matrix/verl.yaml),
    so `git apply` at the repository's root accepts it, whatever directory discover ran in."""
    repo = tmp_path / "repo"
    (repo / "matrix").mkdir(parents=True)
    path = repo / "matrix" / "verl.yaml"
    path.write_text(MATRIX)
    assert _git("init", "-q", cwd=repo).returncode == 0
    assert _git("add", "matrix/verl.yaml", cwd=repo).returncode == 0
    assert _git("commit", "-qm", "matrix", cwd=repo).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # discover runs outside the repository, on its absolute path
    d = run_discovery(load_matrix(str(path)), FakeMeta())
    assert d.patch.startswith("--- a/matrix/verl.yaml\n+++ b/matrix/verl.yaml\n"), d.patch[:200]
    (tmp_path / "discover.patch").write_text(d.patch)
    p = _git("apply", "--check", str(tmp_path / "discover.patch"), cwd=repo)
    assert p.returncode == 0, p.stderr
    assert _git("apply", str(tmp_path / "discover.patch"), cwd=repo).returncode == 0
    assert path.read_text() == patch_text(_matrix_copy(MATRIX, tmp_path), d.proposals)[0]
    # The applied matrix is the one discover planned: its new combinations plan from it.
    ids = {c.id for c in plan(load_matrix(path), meta=FakeMeta()).combos}
    assert {c["id"] for c in d.new_combos} <= ids and d.new_combos
    # Outside any repository: relative to the working directory, never absolute.
    loose = tmp_path / "loose" / "m.yaml"
    loose.parent.mkdir()
    loose.write_text(MATRIX)
    assert patch_path(loose) == "matrix/m.yaml"
    monkeypatch.chdir(tmp_path)
    assert patch_path(loose) == "loose/m.yaml"


def _matrix_copy(text, tmp_path):
    p = tmp_path / "orig" / "verl.yaml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return load_matrix(p)


def test_all_releases_and_nothing_new(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    m = load_matrix(path)
    assert ("vllm", "0.9.0") in {(p.package, p.version) for p in discover(m, FakeMeta(), all_releases=True)}
    path.write_text(MATRIX.replace('- "0.8.4"', '- "0.10.0"').replace('["0.4.1", "0.5.0"]', '["0.6.0"]'))
    d = run_discovery(load_matrix(path), FakeMeta())
    assert [p.package for p in d.proposals] == [] and d.patch == "" and d.new_combos == []


@pytest.mark.network
def test_discover_real_index_proposes_newest_releases(tmp_path, run_cli):
    matrix = tmp_path / "verl.yaml"
    shutil.copy(default_matrix(), matrix)
    p = run_cli("discover", "--matrix", matrix, "--json", timeout=900)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    meta, m = Metadata(), load_matrix(matrix)
    proposed = {(x["package"], x["version"]) for x in d["proposals"]}
    known = {"verl": m.verl, "vllm": m.engines["vllm"], "sglang": m.engines["sglang"]}
    checked = 0
    for pkg, versions in known.items():
        final = [v for v in map(Version, meta.versions(pkg)) if not (v.is_prerelease or v.is_devrelease)]
        newest = max(final)
        if newest > max(map(Version, versions)):
            assert (pkg, str(newest)) in proposed, (pkg, newest, proposed)
            checked += 1
            if pkg != "verl":  # its own torch pin, and a CUDA variant that admits it
                prop = next(x for x in d["proposals"] if (x["package"], x["version"]) == (pkg, str(newest)))
                assert prop["torch"] == meta.torch_pin(pkg, str(newest))
        else:
            assert not any(k == pkg for k, _ in proposed)
    assert checked >= 2  # the default matrix lags the index for at least the engines
    # --apply edits the file so that the newest releases are in the matrix and it still plans.
    p = run_cli("discover", "--matrix", matrix, "--apply", timeout=900)
    assert p.returncode == 0, p.stderr
    m2 = load_matrix(matrix)
    for pkg, v in proposed:
        if pkg in ("vllm", "sglang") and any(x["package"] == pkg and x["version"] == v and x["cuda"]
                                             for x in d["proposals"]):
            assert v in m2.engines[pkg]
    assert {c["id"] for c in d["new_combos"]} <= {c.id for c in plan(m2, meta=meta).combos}
    p = run_cli("discover", "--matrix", matrix, "--json", timeout=900)
    assert not [x for x in json.loads(p.stdout)["proposals"] if x["package"] != "torch"]  # idempotent
