"""Rendered Dockerfiles: golden output, determinism, the layer model (CUDA libraries in their
own layers, shared across torch releases; the layers install exactly the lock), labels, no
secrets."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.bake import split_layers
from envbuild.errors import EnvbuildError
from envbuild.layers import ImageModel, model_for
from envbuild.lockmodel import LayerLock, LockResult
from envbuild.values import Combo
from envbuild.paths import templates_dir
from envbuild.render import render_combo, render_dockerfile, render_stages
from envbuild.values import Base

GOLDEN = Path(__file__).parent / "golden"
# The CUDA wheels torch 2.5.1 and 2.6.0 pin on cu124 (the same set); 2.6.0 adds cusparselt.
NVIDIA = {"nvidia-cublas-cu12": "12.4.5.8", "nvidia-cuda-cupti-cu12": "12.4.127", "nvidia-cuda-nvrtc-cu12": "12.4.127",
          "nvidia-cuda-runtime-cu12": "12.4.127", "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-cufft-cu12": "11.2.1.3",
          "nvidia-curand-cu12": "10.3.5.147", "nvidia-cusolver-cu12": "11.6.1.9", "nvidia-cusparse-cu12": "12.3.1.170",
          "nvidia-nccl-cu12": "2.21.5", "nvidia-nvjitlink-cu12": "12.4.127", "nvidia-nvtx-cu12": "12.4.127"}


def pins(d):
    """{name: version} -> uv's hashed lock text (a fake hash derived from the pin)."""
    out = []
    for n, v in sorted(d.items()):
        h = __import__("hashlib").sha256(f"{n}=={v}".encode()).hexdigest()
        out.append(f"{n}=={v} \\\n    --hash=sha256:{h}\n    # via torch\n")
    return "".join(out)


def fake_lock(combo, verl_pin="0.4.1", torch="2.6.0", nvidia=None, full_extra=None, verl_extra=None):
    tl = {"torch": torch, "sympy": "1.13.1", **(nvidia or {})}
    el = {combo.engine: combo.engine_version, "xformers": "0.0.29.post2"} if combo.engine != "hf" else {}
    vl = {"verl": verl_pin, **(verl_extra or {})}

    def layer(name, d):
        return LayerLock(name, f"# {name}\n" + pins(d), "x", dict(d), "2025-07-11", "k")

    layers = [layer("torch", tl)] + ([layer("engine", el)] if el else []) + [layer("verl", vl)]
    full = pins({**tl, **el, **vl, **(full_extra or {})})
    return LockResult(combo, "ok", layers=layers, lock_hash="f" * 64, era="2025-07-11", full_lock=full,
                      tools=f"uv==0.13.9 \\\n    --hash=sha256:{'1' * 64}\n")


VLLM = Combo(verl="0.4.1", engine="vllm", engine_version="0.8.4", torch="2.6.0", cuda="cu124", python="3.11",
             cuda_toolkit="12.4", base_image="nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", glibc="2.35")
HF = Combo(verl="0.4.1", engine="hf", engine_version="", torch="2.6.0", cuda="cu124", python="3.11",
           cuda_toolkit="12.4", base_image="nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", glibc="2.35")
NV = Base("nvidia", VLLM.base_image)


def check_golden(name, text):
    p = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        p.write_text(text)
    assert text == p.read_text(), f"re-render differs from {p}; UPDATE_GOLDEN=1 to accept"


def test_golden_vllm_and_hf():
    check_golden("Dockerfile.vllm", render_dockerfile(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV))
    check_golden("Dockerfile.hf", render_dockerfile(HF, fake_lock(HF, nvidia=NVIDIA), NV))


def test_deterministic_context_and_hash(tmp_path):
    a = render_combo(VLLM, fake_lock(VLLM), NV, tmp_path / "a")
    b = render_combo(VLLM, fake_lock(VLLM), NV, tmp_path / "b")
    files = sorted(p.relative_to(a.context_dir) for p in a.context_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b.context_dir) for p in b.context_dir.rglob("*") if p.is_file())
    for f in files:
        assert (a.context_dir / f).read_bytes() == (b.context_dir / f).read_bytes()
    assert a.content_hash == b.content_hash
    # the hash covers the lock: another verl pin, another hash
    c = render_combo(VLLM, fake_lock(VLLM, "verl==0.5.0"), NV, tmp_path / "c")
    assert c.content_hash != a.content_hash
    assert (a.context_dir / "envbuild_probe" / "__init__.py").exists()


def test_a_context_file_that_changed_without_changing_its_size_gets_another_time(tmp_path):
    """BuildKit syncs a context by size and time (moby/buildkit#2592): re-rendering the same
    combination with a lock of the same length (0.4.1 -> 0.4.2) must give the changed files other
    times, or the daemon keeps the old copy. Equal bytes keep equal times in any folder."""
    def times(r):
        return {str(p.relative_to(r.context_dir)): p.stat().st_mtime_ns for p in r.context_dir.rglob("*") if p.is_file()}

    lock = tmp_path / "x" / VLLM.id / "locks" / "verl.txt"
    a = times(render_combo(VLLM, fake_lock(VLLM, "0.4.1"), NV, tmp_path / "x"))
    size = lock.stat().st_size
    b = times(render_combo(VLLM, fake_lock(VLLM, "0.4.2"), NV, tmp_path / "x"))  # the same folder, again
    assert lock.stat().st_size == size  # what the sync alone could not tell apart
    changed = {f for f in a if a[f] != b[f]}
    assert "locks/verl.txt" in changed and "Dockerfile" not in changed and "envbuild/secrets-env.sh" not in changed
    assert times(render_combo(VLLM, fake_lock(VLLM, "0.4.2"), NV, tmp_path / "y")) == b


def test_layer_order_header_labels_and_no_secret_in_dockerfile():
    text = render_dockerfile(VLLM, fake_lock(VLLM), NV)
    assert text.startswith("# generated by envbuild")
    order = [text.index(s) for s in ("FROM ", "locks/tools.txt", "locks/torch.txt", "locks/engine.txt",
                                     "locks/verl.txt", "source=envbuild_probe,")]
    assert order == sorted(order)
    for label in ("org.opencontainers.image.title", 'org.envbuild.verl="0.4.1"', 'org.envbuild.engine-version="0.8.4"',
                  'org.envbuild.torch="2.6.0"', 'org.envbuild.cuda="cu124"', f'org.envbuild.lock-hash="{"f" * 64}"',
                  'org.opencontainers.image.version="verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11-20250711"'):
        assert label in text
    # One envbuild namespace.
    assert {k.rsplit(".", 1)[0] for k in re.findall(r"(org\.envbuild\.[a-z-]+|io\.envbuild\.[a-z-]+)=", text)} \
        == {"org.envbuild"}
    assert "--mount=type=secret,id=ca-bundle" in text and "--require-hashes" in text
    for banned in ("ARG ", "ca-certificates.crt", "PIP_CERT=/", "https://"):
        assert banned not in text.replace("PIP_CERT=/run/secrets", "")


def test_combinations_sharing_torch_share_the_dockerfile_prefix():
    a = render_dockerfile(VLLM, fake_lock(VLLM), NV)
    b = render_dockerfile(HF, fake_lock(HF), NV)
    cut = "# The rollout engine"
    prefix_a = a[a.index("FROM "):a.index(cut)]
    prefix_b = b[b.index("FROM "):b.index("# verl itself")]
    assert prefix_a.strip() == prefix_b.strip()


def _runs(text):
    """RUN instructions of a Dockerfile with their continuation lines (test-side reading only)."""
    return re.findall(r"^RUN .*?[^\\]$", text, re.M | re.S)


def test_the_venv_seed_leaves_with_the_tools_and_comes_back_last_where_the_lock_has_none():
    # A step that replaced the seed's setuptools with the lock's would delete files of the tools
    # layer: its whiteout carries the build's time, so the layer would differ from build to build.
    runs = _runs(render_dockerfile(HF, fake_lock(HF), NV))
    tools = next(r for r in runs if "source=locks/tools.txt" in r)
    # moved to a stash in the same layer (no file of a lower layer is deleted), with bytecode
    # written under a fixed hash seed so the stash's bytes are equal across builds
    assert tools.index("venv-seed.py stash /opt/envbuild/venv-seed.tar setuptools;") > tools.index("--prefix /opt/uv")
    assert "PYTHONHASHSEED=0" in tools and "source=envbuild/venv-seed.py" in tools
    restored = [r for r in runs if "venv-seed.py restore /opt/envbuild/venv-seed.tar;" in r]
    assert len(restored) == 1 and "source=locks/verl.txt" in restored[0]  # the last install step
    assert restored[0].index("venv-seed.py restore") > restored[0].index("compile-bytecode.py")
    pinned = fake_lock(HF, verl_extra={"setuptools": "80.9.0"})
    assert "venv-seed.py restore" not in render_dockerfile(HF, pinned, NV)  # the lock's setuptools is the environment's


def test_etc_stubs_come_from_a_tar_with_fixed_bytes(tmp_path):
    import tarfile
    a = render_combo(HF, fake_lock(HF), NV, tmp_path / "a")
    assert "\nADD envbuild/etc-stubs.tar /\n" in a.dockerfile.read_text()
    assert not (a.context_dir / "envbuild" / "etc").exists()
    with tarfile.open(a.context_dir / "envbuild" / "etc-stubs.tar") as t:
        got = [(m.name, m.type, m.mode, m.mtime, m.uid, m.gid, m.size) for m in t]
    assert got == [("etc", tarfile.DIRTYPE, 0o755, 946684800, 0, 0, 0)] + [
        (f"etc/{n}", tarfile.REGTYPE, 0o644, 946684800, 0, 0, 0) for n in ("hostname", "hosts", "resolv.conf")]


def test_cuda_libraries_get_their_own_layers_shared_across_torch_releases(tmp_path):
    old = fake_lock(VLLM, torch="2.5.1", nvidia=NVIDIA)
    new = fake_lock(VLLM, torch="2.6.0", nvidia={**NVIDIA, "nvidia-cusparselt-cu12": "0.6.2"})
    ma, mb = model_for(VLLM, old, NV), model_for(VLLM, new, NV)
    names = [l.name for l in mb.layers]
    assert names == ["cuda-cudnn", "cuda-cublas", "cuda-nccl", "cuda-cusparse", "cuda-cusparselt", "cuda-cufft",
                     "cuda-runtime", "torch-deps", "torch", "engine", "kernels", "verl"]
    assert [l.stage for l in mb.layers] == ["torch"] * 9 + ["engine"] * 2 + ["final"]
    assert mb.layers[names.index("kernels")].packages == {"xformers": "0.0.29.post2"}
    assert all(n.startswith("nvidia-") for l in mb.layers if l.name.startswith("cuda-") for n in l.packages)
    # Same wheels, same layer: same lock bytes, same RUN text; 2.6.0's new cusparselt is a layer of its own.
    a, b = {l.name: l for l in ma.layers}, {l.name: l for l in mb.layers}
    same = [n for n in a if n.startswith("cuda-") and a[n].key == b[n].key]
    assert same == ["cuda-cudnn", "cuda-cublas", "cuda-nccl", "cuda-cusparse", "cuda-cufft", "cuda-runtime"]
    assert "cuda-cusparselt" in b and "cuda-cusparselt" not in a
    assert a["torch"].key != b["torch"].key
    ra, rb = render_combo(VLLM, old, NV, tmp_path / "a"), render_combo(VLLM, new, NV, tmp_path / "b")
    for n in same:
        assert (ra.context_dir / a[n].lock_file).read_bytes() == (rb.context_dir / b[n].lock_file).read_bytes()
        run_a = [r for r in _runs(ra.dockerfile.read_text()) if a[n].lock_file in r]
        run_b = [r for r in _runs(rb.dockerfile.read_text()) if b[n].lock_file in r]
        assert run_a == run_b and len(run_a) == 1
    # The order of the Dockerfile is the model's order.
    text = rb.dockerfile.read_text()
    pos = [text.index(f"source={l.lock_file},") for l in mb.layers]
    assert pos == sorted(pos)
    # Context files carry times derived from their bytes (equal content, equal times on any machine;
    # render.context_time_ns), folders one fixed time.
    from envbuild.render import context_time_ns
    for p in ra.context_dir.rglob("*"):
        assert p.stat().st_mtime_ns == (context_time_ns(p.read_bytes()) if p.is_file() else 946684800 * 10**9), p


def test_layers_install_exactly_the_lock():
    m = model_for(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV)
    folded = {}
    for l in m.layers:
        folded.update(l.packages)
    assert folded == m.expected and "torch" in folded and "verl" in folded
    # A lock whose full resolution holds a package that no layer installs is refused.
    with pytest.raises(EnvbuildError, match="would not install the lock"):
        model_for(VLLM, fake_lock(VLLM, nvidia=NVIDIA, full_extra={"ray": "2.40.0"}), NV)


def test_check_env_script_accepts_the_environment_and_names_differences(tmp_path):
    """dockerfiles/check-env.py (run at the end of every build) against this interpreter."""
    script = templates_dir() / "check-env.py"
    seed = {"pip", "setuptools", "wheel"}
    # What a fresh interpreter sees (as the script does): other tests may add folders to this
    # process's sys.path, whose packages the script rightly does not see.
    listing = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, json; "
                              "print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()]))"],
                             capture_output=True, text=True, check=True).stdout
    have = {}
    for name, version in json.loads(listing):
        n = re.sub(r"[-_.]+", "-", name).lower()
        if n not in seed:
            have[n] = version
    exp = tmp_path / "expected.txt"
    exp.write_text("".join(f"{n}=={v}\n" for n, v in sorted(have.items())))
    ok = subprocess.run([sys.executable, str(script), str(exp)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    name = sorted(have)[0]
    exp.write_text("".join(f"{n}=={'0.0.0' if n == name else v}\n" for n, v in sorted(have.items()) if n != sorted(have)[1]))
    bad = subprocess.run([sys.executable, str(script), str(exp)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"{name}: lock 0.0.0" in bad.stderr and f"{sorted(have)[1]} " in bad.stderr


def test_base_pinned_by_digest_and_oci_labels():
    dig = "sha256:" + "a" * 64
    text = render_dockerfile(VLLM, fake_lock(VLLM), Base("nvidia", VLLM.base_image, dig))
    assert f"FROM {VLLM.base_image}@{dig}\n" in text
    assert f'org.opencontainers.image.base.digest="{dig}"' in text
    assert f'org.opencontainers.image.base.name="{VLLM.base_image}"' in text
    assert "org.opencontainers.image.base.digest" not in render_dockerfile(VLLM, fake_lock(VLLM), NV)


def test_bake_stages_render_the_same_dockerfile_from_the_model(tmp_path):
    """The bake writer's stages are the template over the model: the image's Dockerfile is
    their concatenation (each stage FROM its parent), read from the saved model."""
    r = render_combo(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV, tmp_path)
    saved = json.loads((tmp_path / f"{VLLM.id}.json").read_text())["model"]
    m = ImageModel.from_dict(saved)
    assert m == r.model
    stages = split_layers(m)
    assert [s for s, _ in stages] == ["torch", "engine", "final"]
    assert stages[1][1].startswith("FROM envbuild-torch\n") and stages[2][1].startswith("FROM envbuild-engine\n")
    body = "".join(t.split("\n", 1)[1] for _, t in stages)
    full = r.dockerfile.read_text()
    assert full.endswith(body) and full[:-len(body)].rstrip().endswith(f"FROM {NV.ref}")
    assert render_stages(m) == full


def test_build_constraints_reach_the_steps_that_may_build(tmp_path):
    lock = fake_lock(VLLM, nvidia=NVIDIA)
    lock.build_constraints = "setuptools==75.8.0 \\\n    --hash=sha256:" + "2" * 64 + "\n"
    r = render_combo(VLLM, lock, NV, tmp_path)
    assert (r.context_dir / "locks/build-constraints.txt").read_text() == lock.build_constraints
    runs = {re.search(r"source=locks/([a-z-]+)\.txt", x).group(1): x for x in _runs(r.dockerfile.read_text())
            if "source=locks/" in x and "check-env" not in x}
    for name, text in runs.items():
        assert ("--build-constraints /opt/envbuild/in/build-constraints.txt" in text) == \
            (name in ("engine", "kernels", "verl")), name
    # Without constraints, the steps do not mention them (and the CUDA layers never do).
    plain = render_dockerfile(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV)
    assert "--build-constraints" not in plain


def test_a_source_build_is_built_again_in_its_own_step_not_taken_from_the_wheel_cache(tmp_path):
    # uv's cache of built wheels may hold one built with another setuptools (its WHEEL and RECORD
    # differ): the step that builds a package from source refreshes it, so the layer follows its lock.
    lock = fake_lock(VLLM, nvidia=NVIDIA)
    lock.build_constraints = "setuptools==80.9.0 \\\n    --hash=sha256:" + "2" * 64 + "\n"
    lock.built_from_source = ["verl==0.4.1", "xformers==0.0.29.post2"]
    r = render_combo(VLLM, lock, NV, tmp_path)
    runs = {re.search(r"source=locks/([a-z-]+)\.txt", x).group(1): x for x in _runs(r.dockerfile.read_text())
            if "source=locks/" in x and "check-env" not in x}
    refreshed = {name: re.findall(r"--refresh-package (\S+?)[;\s]", text) for name, text in runs.items()}
    assert refreshed.pop("verl") == ["verl"] and refreshed.pop("kernels") == ["xformers"]
    assert not any(refreshed.values()), refreshed
    assert r.model.built_from_source == ("verl==0.4.1", "xformers==0.0.29.post2")
    from envbuild.layers import ImageModel
    assert ImageModel.from_dict(r.model.to_dict()) == r.model


def test_torch_lock_layers_unpack_into_a_cache_of_their_own_and_hardlink(tmp_path):
    # The torch lock's steps (large pinned wheels) keep no unpacked copy in the shared cache mount
    # and link from a cache in their own filesystem, removed in the same step; the engine and verl
    # steps, whose many packages recur across combinations, keep using the shared cache.
    from envbuild.layers import STEP_CACHE_DIR
    r = render_combo(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV, tmp_path)
    runs = {re.search(r"source=locks/([a-z-]+)\.txt", x).group(1): x for x in _runs(r.dockerfile.read_text())
            if "source=locks/" in x and "check-env" not in x and "tools.txt" not in x}
    torch_lock = {l.name for l in r.model.layers if l.source == "torch"}
    assert torch_lock >= {"cuda-cudnn", "torch-deps", "torch"} and set(runs) - torch_lock == {"engine", "kernels", "verl"}
    for name, text in runs.items():
        own = name in torch_lock
        assert ("--mount=type=cache,id=envbuild-uv" in text) != own, name
        assert (f"--cache-dir {STEP_CACHE_DIR} --link-mode hardlink" in text) == own, name
        if own:  # removed before the step's files are normalized and committed
            assert text.index(f"rm -rf {STEP_CACHE_DIR};") > text.index("uv pip install"), name
            assert text.index(f"rm -rf {STEP_CACHE_DIR};") < text.index("find /opt"), name


def test_one_base_type_and_resolver():
    """render, ci bake and build resolve bases with envbuild.base.resolve_base; an image pulled
    from a registry is pinned by its registry digest, a local-only one is not."""
    from types import SimpleNamespace

    from envbuild import base as B
    from envbuild import render as R
    from envbuild import values as V
    from envbuild.errors import InputError

    assert R.Base is V.Base and B.Base is V.Base  # the one type, in the values module
    dig = "sha256:" + "b" * 64
    eng = SimpleNamespace(repo_digests=lambda ref: [f"other/repo@sha256:{'c' * 64}", f"nvidia/cuda@{dig}"])
    got = B.resolve_base(eng, "nvidia", VLLM)
    assert got == B.Base("nvidia", VLLM.base_image, dig) and got.pinned == f"{VLLM.base_image}@{dig}"
    assert B.Base.from_dict(got.to_dict()) == got
    local = SimpleNamespace(repo_digests=lambda ref: [])
    assert B.resolve_base(local, "my/base:1", VLLM).pinned == "my/base:1"
    assert R.base_for(VLLM, "nvidia") == B.Base("nvidia", VLLM.base_image)  # no engine: nothing asked
    assert R.base_for(VLLM, "bootstrap", "envbuild/base:x") == B.Base("bootstrap", "envbuild/base:x")
    with pytest.raises(InputError):
        R.base_for(VLLM, "--oops")


def test_an_image_whose_lock_pins_a_jit_library_compiles_its_kernels_ahead_of_time():
    """vocab.JIT_KERNELS: a lock with flashinfer-python gets the build step (FlashInfer's sampler,
    ~100 s of nvcc on a fresh GPU node); one without it does not."""
    plain = render_dockerfile(VLLM, fake_lock(VLLM, nvidia=NVIDIA), NV)
    assert "envbuild_probe.jit" not in plain
    m = model_for(VLLM, fake_lock(VLLM, nvidia=NVIDIA, full_extra={"flashinfer-python": "0.6.12"},
                                  verl_extra={"flashinfer-python": "0.6.12"}), NV)
    assert m.jit_kernels == ["flashinfer-sampling"]
    text = render_stages(m)
    step = next(r for r in _runs(text) if "envbuild_probe.jit" in r)
    assert "python -m envbuild_probe.jit build flashinfer-sampling" in step
    # after the probe is in the image (the step runs it) and before the labels, in the final stage
    assert text.index("ENV PYTHONPATH=/opt/envbuild") < text.index(step) < text.index("LABEL ")
    assert "--mount=type=tmpfs,target=/tmp" in step


def test_an_engines_system_packages_and_index_come_from_its_descriptor(monkeypatch):
    """vocab.EngineSpec (issue 51): an engine that needs a system library at import and serves its
    wheels from an index of its own (as TensorRT-LLM's MPI runtime and NVIDIA's index would) gets
    an apt step right before its layers and that index on its layers' install, from the descriptor
    alone; the layers below stay the other engines', and an engine without them renders as before."""
    import dataclasses

    from envbuild.probe import vocab

    before = render_dockerfile(VLLM, fake_lock(VLLM), NV)
    spec = dataclasses.replace(vocab.ENGINE["vllm"], system_packages=("libopenmpi3", "libnuma1"),
                               extra_index="https://engine-wheels.invalid/simple")
    monkeypatch.setitem(vocab.ENGINE, "vllm", spec)
    text = render_dockerfile(VLLM, fake_lock(VLLM), NV)
    step = next(r for r in _runs(text) if "apt-get install" in r and "libopenmpi3" in r)
    assert "--no-install-recommends libopenmpi3 libnuma1" in step and "rm -rf /var/lib/apt/lists/*" in step
    cut = "# The rollout engine"
    head = text.index("# What vllm's runtime loads from the system")
    assert head < text.index(step) < text.index(cut) and text[:head] == before[:head]  # base, torch: as before
    installs = [r for r in _runs(text) if "uv pip install --no-deps" in r]
    engine = [r for r in installs if "from locks/engine" in r or "from locks/kernels" in r]  # cut from the engine's lock
    assert engine and all("--index https://engine-wheels.invalid/simple --index-strategy unsafe-best-match" in r
                          for r in engine)
    assert all("engine-wheels.invalid" not in r for r in installs if r not in engine)
    assert "engine-wheels.invalid" not in before and "libopenmpi3" not in before
