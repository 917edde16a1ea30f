"""End to end on the real engine and the real package index: ci/services.sh's daemon and
loopback registry, a debootstrapped base, two real combinations that share their torch layer,
push, pull back by the recorded digest, and proof that the CA bundle and the index credentials
(BuildKit secrets) are in no layer and not in `docker history`.

Run: pytest -m "docker and network and slow" tests/test_e2e_build.py   (~10-20 min cold)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "127.0.0.1:5000"
# vLLM 0.8.4 pins torch 2.6.0, whose default wheels are cu124; the hf engine with the same torch
# differs only above the torch layer.
COMBOS = [["--cuda", "cu124", "--vllm", "0.8.4", "--verl", "0.4.1"],
          ["--cuda", "cu124", "--hf", "--torch", "2.6.0", "--verl", "0.4.1"]]
PEM_RE = re.compile(rb"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----", re.S)


def sh(*cmd, **kw):
    kw.setdefault("check", True)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def services():
    if not shutil.which("debootstrap") and os.geteuid() != 0:
        pytest.skip("needs root to install and start services")
    p = sh(str(ROOT / "ci" / "services.sh"), check=False, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    from envbuild.docker import detect

    return detect()


@pytest.fixture(scope="module")
def base(services):
    from envbuild.base import bootstrap, default_bootstrap_ref

    # The base stays: it is shared with the other docker tests, which run beside this module
    # (pytest -n) and build FROM it; removing it at teardown failed one of them mid-build.
    assert bootstrap(services).ref == default_bootstrap_ref()
    return default_bootstrap_ref()


def cli(*args, env=None, timeout=3600):
    return subprocess.run([sys.executable, "-m", "envbuild", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def host_only_certs(engine, image: str, bundle: Path) -> list[bytes]:
    """Certificates of the build machine's bundle that the base image's distribution bundle lacks
    (the intercepting proxy's CA, when there is one): they must never show up in a layer."""
    p = subprocess.run([engine.client, "run", "--rm", "--network", "host", "--entrypoint", "cat", image,
                        "/etc/ssl/certs/ca-certificates.crt"], capture_output=True, check=True)
    mine = {b"".join(m.split()) for m in PEM_RE.findall(p.stdout)}
    return [b"".join(m.split()) for m in PEM_RE.findall(bundle.read_bytes()) if b"".join(m.split()) not in mine]


def scan_layers(images: list[str], needles: list[bytes]) -> dict[str, dict[str, int]]:
    """Stream what the registry serves for each pushed image (`repo@sha256:...`): its manifest,
    its config (env, labels, history) and every file of every layer blob, each blob read once
    however many images share it, and search them for each needle:
    {image: {needle[:40]: hits in that image's manifest, config and layers}}.

    Read from the registry, not `docker save`: it is what a user pulls, and Docker 20.10's save
    stages every image in /var/lib/docker/tmp first (two images here are ~10 GB of a shared disk;
    a CI run whose save failed read an empty stream)."""
    from envbuild.push import MANIFEST_TYPES

    longest = max(len(n) for n in needles)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    nfiles = 0
    found: dict[str, dict[str, int]] = {}  # blob digest -> hits in it

    def search(f, hits):
        nonlocal nfiles
        nfiles += 1
        carry = b""
        while True:
            chunk = f.read(8 << 20)
            if not chunk:
                return
            buf = carry + chunk
            # PEM bodies are base64 split over lines: search the bytes with line breaks dropped too
            flat = buf.replace(b"\n", b"")
            for n in needles:
                if n in buf or n in flat:
                    hits[n.decode(errors="replace")[:40]] += 1
            carry = buf[-(longest * 2):]

    class Hashed:  # the blob's bytes as read, so a short or wrong stream is caught, never skipped
        def __init__(self, f):
            self.f, self.h, self.n = f, hashlib.sha256(), 0

        def read(self, size=-1):
            b = self.f.read(size)
            self.h.update(b)
            self.n += len(b)
            return b

    out: dict[str, dict[str, int]] = {}
    for image in images:
        name, digest = image.split("@", 1)
        host, repo = name.split("/", 1)
        req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{digest}", headers={"Accept": MANIFEST_TYPES})
        raw = opener.open(req, timeout=30).read()
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest, f"{image}: the registry served another manifest"
        manifest = json.loads(raw)
        blobs = [("manifest", digest, None), ("config", manifest["config"]["digest"], None),
                 *(("layer", la["digest"], la["mediaType"]) for la in manifest["layers"])]
        assert len(blobs) > 3, manifest
        for kind, dig, media in blobs:
            if dig in found:
                continue
            hits = found[dig] = {n.decode(errors="replace")[:40]: 0 for n in needles}
            if kind == "manifest":
                search(io.BytesIO(raw), hits)
                continue
            with opener.open(f"http://{host}/v2/{repo}/blobs/{dig}", timeout=600) as resp:
                f = Hashed(resp)
                if kind == "config":
                    search(f, hits)
                else:
                    assert not (media or "").endswith("zstd"), f"{image}: {media} layers are not read here"
                    with tarfile.open(fileobj=f, mode="r|*") as inner:  # plain tar or gzip
                        for im in inner:
                            if im.isfile():
                                search(inner.extractfile(im), hits)
                    while f.read(1 << 20):  # the tar's padding after its end-of-archive blocks
                        pass
                assert "sha256:" + f.h.hexdigest() == dig, f"{image}: blob {dig} read as {f.n} bytes of another digest"
        total = {n.decode(errors="replace")[:40]: 0 for n in needles}
        for _, dig, _ in blobs:
            for k, c in found[dig].items():
                total[k] += c
        out[image] = total
    assert nfiles > 1000, f"scanned only {nfiles} files of {images}: not real images?"
    return out


def test_build_push_pull_and_no_secret_in_layers(services, base, tmp_path):
    engine = services
    run = uuid.uuid4().hex[:8]
    marker = f"envbuild-e2e-secret-{run}"
    token = f"tok-{uuid.uuid4().hex}"
    host_bundle = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    # the CA bundle the build gets: the host's (the proxy needs it) plus a marker line PEM parsers skip
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_bytes(host_bundle.read_bytes() + f"\n# {marker}\n".encode())
    from envbuild.index_config import default_index_url

    idx = default_index_url()
    assert "@" not in idx, "this test adds its own credentials to the configured index URL"
    env = {**os.environ, "PIP_INDEX_URL": idx.replace("://", f"://envbuild-e2e:{token}@", 1)}
    env.pop("UV_DEFAULT_INDEX", None), env.pop("UV_INDEX_URL", None)
    repo = f"{REGISTRY}/envbuild-e2e/verl-{run}"
    results = tmp_path / "results"
    refs: list[str] = []
    try:
        for sel in COMBOS:
            p = cli("build", *sel, "--base", "bootstrap", "--repository", repo, "--push", "--ca-bundle", str(bundle),
                    "--results", str(results), "--timeout", "2400", env=env)
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            assert f"images: {repo}" in p.stdout and str(results / "records") in p.stdout
        from envbuild.record import latest_by_combo

        recs = latest_by_combo(results)
        assert len(recs) == 2
        for r in recs.values():
            assert (r.status, r.stage) == ("ok", "build"), r.detail
            assert r.base == {"kind": "bootstrap", "ref": base}
            assert re.fullmatch(re.escape(repo) + r"@sha256:[0-9a-f]{64}", r.image["digest"])
            assert r.image["size"] > 1_000_000_000 and r.lock_hash
            assert (results / r.log).is_file()
            refs += r.image["tags"]
        vllm, hf = (recs[k] for k in sorted(recs, key=lambda k: "hf" in k))

        # shared torch layer: the hf image repeats the vLLM image's layers up to and including torch
        lv, lh = engine.layers(vllm.image["ref"]), engine.layers(hf.image["ref"])
        shared = next((i for i, (a, b) in enumerate(zip(lv, lh)) if a != b), min(len(lv), len(lh)))
        # base, secrets helper, tools, the CUDA-library layers, torch's dependencies, torch
        assert shared >= 6 and shared < len(lh), (shared, lv, lh)
        rows = engine.cmd("history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}",
                          hf.image["ref"]).stdout.splitlines()
        torch_rows = [int(r.split("\t")[0]) for r in rows if "locks/torch.txt" in r and "uv pip install" in r]
        assert torch_rows and torch_rows[0] > 1_000_000_000, rows
        # the torch lock's steps unpacked into a cache of their own and hardlinked from it: the
        # cache is gone and every installed file has one link (no second copy in the layer)
        from envbuild.layers import STEP_CACHE_DIR
        p = engine.cmd("run", "--rm", "--network", "host", "--entrypoint", "sh", hf.image["ref"], "-c",
                       f"test ! -e {STEP_CACHE_DIR} && find /opt/venv/lib -type f -links +1 | wc -l && "
                       "find /opt/venv/lib/python3.11/site-packages/torch -type f | wc -l", check=False)
        assert p.returncode == 0 and p.stdout.split()[0] == "0" and int(p.stdout.split()[1]) > 1000, p.stdout + p.stderr
        # fastapi and fastapi-cli (both in the verl step here) write bin/fastapi; uv's parallel install
        # left either one, settle-overlaps.py keeps fastapi-cli's (the last name) in every build
        vlog = (results / vllm.log).read_text()
        verl_step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*source=locks/verl\.txt,.*$", vlog, re.M)
        assert verl_step, vlog[-3000:]
        if not re.search(rf"^#{verl_step.group(1)} CACHED$", vlog, re.M):  # a cached step prints nothing
            assert "fastapi and fastapi-cli write bin/fastapi with different bytes; fastapi-cli's is kept" in vlog
        script = engine.cmd("run", "--rm", "--network", "host", "--entrypoint", "cat", vllm.image["ref"],
                            "/opt/venv/bin/fastapi").stdout
        assert "from fastapi_cli.cli import main" in script, script

        # the second build took the first's torch layer from the cache instead of installing it again
        log = (results / hf.log).read_text()
        step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*source=locks/torch\.txt,.*$", log, re.M)
        assert step and re.search(rf"^#{step.group(1)} CACHED$", log, re.M), log[-3000:]
        # ... and its verl step took the .pyc of the files it shares with the first's layers from
        # the bytecode cache (compile-bytecode.py) instead of compiling them again
        step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*source=locks/verl\.txt,.*$", log, re.M)
        if step and not re.search(rf"^#{step.group(1)} CACHED$", log, re.M):
            m = re.search(rf"^#{step.group(1)} [0-9.]+ envbuild: bytecode for (\d+) files of \d+ distributions: "
                          r"(\d+) from the cache", log, re.M)
            assert m and 0 < int(m.group(2)) <= int(m.group(1)), log[-3000:]
        p = engine.cmd("run", "--rm", "--network", "host", "--entrypoint", "sh", hf.image["ref"], "-c",
                       "cd /opt/venv/lib/python3.11/site-packages && find . -name '*.py' | wc -l && "
                       "find . -name '*.pyc' | wc -l", check=False)
        n_py, n_pyc = map(int, p.stdout.split())
        assert n_py > 5000 and n_pyc >= 0.99 * n_py, p.stdout + p.stderr  # every layer's bytecode is there
        # the venv's seed: the tools step moved setuptools into an archive and the hf image's last
        # step unpacked it (its lock pins none): the files a fresh venv of the image's Python gets,
        # and pkg_resources imports (verl 0.4.1 uses it)
        seed_files = ("cd {}/lib/python3.11/site-packages && find setuptools* pkg_resources _distutils_hack "
                      "distutils-precedence.pth -type f ! -name '*.pyc' ! -name RECORD -exec sha256sum {{}} + | sort -k2")
        p = engine.cmd("run", "--rm", "--network", "host", "--entrypoint", "sh", hf.image["ref"], "-c",
                       "python3.11 -m venv /tmp/fresh && " + seed_files.format("/tmp/fresh") + " > /tmp/a && " +
                       seed_files.format("/opt/venv") + " > /tmp/b && cmp /tmp/a /tmp/b && wc -l < /tmp/a && "
                       "python -c 'import pkg_resources, setuptools; print(setuptools.__version__)'", check=False)
        assert p.returncode == 0 and int(p.stdout.split()[0]) > 100, p.stdout + p.stderr
        seed = p.stdout.split()[-1]
        p = engine.cmd("run", "--rm", "--network", "host", "--entrypoint", "sh", vllm.image["ref"], "-c",
                       "ls -d /opt/venv/lib/python3.11/site-packages/setuptools-*.dist-info && "
                       "sed -n 's/^setuptools==//p' /opt/envbuild/locks/expected.txt && "
                       "python -c 'import setuptools; print(setuptools.__version__)'", check=False)
        out = p.stdout.split()
        # one setuptools: the lock's own where it pins one, else the seed, as in the hf image (the
        # vLLM lock stopped pinning it when the lock floored google-api-core 1.16.0, of 2020, which
        # required it)
        assert p.returncode == 0 and len(out) in (2, 3) and out[-1] == (out[1] if len(out) == 3 else seed), \
            p.stdout + p.stderr

        # no secret in any layer, the config or `docker history`
        needles = [marker.encode(), token.encode()]
        for c in host_only_certs(engine, base, host_bundle):  # vs the distribution's bundle in the base
            needles += [c[:64], c[-100:-36]]  # its serial number and its signature: unique to it
        for r in (vllm, hf):
            hist = engine.history(r.image["ref"]) + json.dumps(engine.inspect(r.image["ref"]))
            assert marker not in hist and token not in hist
            assert all(n.decode() not in hist.replace("\n", "") for n in needles)
        # a positive control: the torch lock's header is in a layer, so the scan does read files
        control = b"# envbuild layer torch:"
        scanned = scan_layers([vllm.image["digest"], hf.image["digest"]], [control, *needles])
        for ref, hits in scanned.items():
            assert hits.pop(control.decode()) > 0, ref
            assert not any(hits.values()), (ref, hits)
        for p in results.rglob("*"):
            if p.is_file():
                assert token not in p.read_text(errors="replace"), p

        # pull back by the recorded digest: same image
        for r in (vllm, hf):
            engine.remove(*r.image["tags"])
            assert not engine.image_exists(r.image["ref"])
            engine.pull(r.image["digest"])
            assert engine.image_id(r.image["digest"]) == r.image["id"]
            refs.append(r.image["digest"])

        # a rerun is a no-op: the content tag is in the registry, nothing is rebuilt
        p = cli("build", *COMBOS[1], "--base", "bootstrap", "--repository", repo, "--push", "--ca-bundle", str(bundle),
                "--results", str(results), env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        again = latest_by_combo(results)[hf.combo["id"]]
        refs += (again.image or {}).get("tags") or []  # removed at the end, even if it was built again
        assert again.run_id != hf.run_id and again.image["reused"] and again.image["digest"] == hf.image["digest"], \
            (again.image, hf.image, p.stdout[-2000:], p.stderr[-2000:])

        # The registry's copies (uncompressed on a loopback registry, ~10 GB) and the images have said
        # what they had to: freed before the second build of the vLLM image, on a disk other runs share
        # (a registry that ran out of it answered a blob upload with HTTP 500 here).
        engine.remove(*refs, force=True)
        _delete_repo(repo)

        # equal inputs, equal layers: the vLLM image built again from nothing (--no-cache: no layer
        # and fresh cache mounts, as on a new machine) has every layer of the first, byte for byte;
        # its lock pins setuptools over the venv's seed, and /etc gets the builder's stubs. (Docker
        # Engine 20.10 leaves the rebuilt copies of layers it already holds on disk, ~8 GB a run:
        # a fresh CI machine does not notice; a machine running this often needs them removed.)
        p = cli("build", *COMBOS[0], "--base", "bootstrap", "--no-cache", "--rebuild", "--ca-bundle", str(bundle),
                "--results", str(tmp_path / "rebuilt"), "--timeout", "2400", env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rebuilt = latest_by_combo(tmp_path / "rebuilt")[vllm.combo["id"]]
        refs += rebuilt.image["tags"]
        assert engine.layers(rebuilt.image["ref"]) == lv, "a layer differs between two builds of one context"
    finally:
        engine.remove(*refs, force=True)
        _delete_repo(repo)


def _delete_repo(repo: str) -> None:
    """Delete the test's manifests from the registry and collect their blobs, so runs do not
    fill the disk."""
    host, name = repo.split("/", 1)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        tags = json.load(opener.open(f"http://{host}/v2/{name}/tags/list", timeout=10)).get("tags") or []
    except OSError:
        return
    from envbuild.push import MANIFEST_TYPES

    for t in tags:
        req = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{t}", method="HEAD",
                                     headers={"Accept": MANIFEST_TYPES})
        try:
            dig = opener.open(req, timeout=10).headers["Docker-Content-Digest"]
            opener.open(urllib.request.Request(f"http://{host}/v2/{name}/manifests/{dig}", method="DELETE"), timeout=10)
        except OSError:
            pass
    cfg = Path(os.environ.get("ENVBUILD_STATE_DIR", "/var/lib/envbuild-services")) / "registry.yml"
    if cfg.is_file() and shutil.which("docker-registry"):
        subprocess.run(["docker-registry", "garbage-collect", str(cfg)], capture_output=True)
