"""publish -> pick -> `docker pull` of the picked digest from the local registry (real Docker).

The image is a real (tiny) image pushed to the real registry on 127.0.0.1; its probe verdict is
constructed here: this test is about the chain table -> digest -> pull, the probe has its own.
"""

import io
import json
import os
import secrets
import subprocess
import tarfile
import urllib.request

import pytest
from table_fixtures import combo, passed, rec, write_all

from envbuild.sign import write_keypair
from envbuild.table import publish

pytestmark = pytest.mark.docker
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
REGISTRY = os.environ.get("ENVBUILD_REGISTRY_ADDR", "127.0.0.1:5000")


def _registry_up() -> bool:
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=3):
            return True
    except Exception:
        return False


def docker(*args, **kw):
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture
def pushed_image():
    if subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0 or not _registry_up():
        if os.environ.get("CI"):
            pytest.fail(f"docker or the registry on {REGISTRY} is not answering (run ci/services.sh)")
        pytest.skip(f"docker or the registry on {REGISTRY} is not answering (ci/services.sh starts them)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = secrets.token_hex(16).encode()  # unique content -> unique digest per run
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ref = f"{REGISTRY}/envbuild-test/pick:{secrets.token_hex(4)}"
    p = subprocess.run([DOCKER, "import", "-", ref], input=buf.getvalue(), capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr
    p = docker("push", ref)
    assert p.returncode == 0, p.stderr
    digest = next(line.split("digest: ")[1].split()[0] for line in p.stdout.splitlines() if "digest: " in line)
    pinned = f"{ref.rsplit(':', 1)[0]}@{digest}"
    yield ref, pinned
    docker("rmi", "-f", ref, pinned)
    # Leave no tag in the registry run after run (deletes are enabled by ci/services.sh).
    import urllib.request

    req = urllib.request.Request(f"http://{REGISTRY}/v2/envbuild-test/pick/manifests/{digest}", method="DELETE")
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10).close()


def test_pick_prints_a_digest_that_docker_pull_resolves(pushed_image, tmp_path, run_cli):
    ref, pinned = pushed_image
    c = combo(ev="0.8.4")
    write_all(tmp_path / "results", [rec(c, passed("env", "contract"), run=1,
                                         img={"ref": ref, "id": "x", "digest": pinned})])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    publish(tmp_path / "results", priv, tmp_path / "table")
    p = run_cli("pick", "--vllm", "0.8.4", "--table", tmp_path / "table", "--pubkey", pub, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ref"] == pinned
    assert docker("rmi", "-f", ref).returncode == 0  # drop the local copy: the pull must fetch it
    pull = docker("pull", out["ref"])
    assert pull.returncode == 0, pull.stderr
    digests = json.loads(docker("image", "inspect", "--format", "{{json .RepoDigests}}", out["ref"]).stdout)
    assert pinned in digests
