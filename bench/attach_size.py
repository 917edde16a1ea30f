"""Bytes the attestations add to one image in its registry (envbuild.attach).

Builds the three statements for a combination from its real layer locks (`envbuild lock --out
DIR` writes them) and a dpkg status file, attaches them to a few-kB image pushed to the local
registry (Debian's, no referrers API: the cosign `.att` tag carries them), and prints what each
envelope and the manifests cost. The image's repository tag and the .att tag are deleted after.

  python3 bench/attach_size.py --locks locks/verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11 \
      [--dpkg /var/lib/dpkg/status] [--registry 127.0.0.1:5000] [--json bench/attach_size.json]
"""

from __future__ import annotations

import argparse
import io
import json
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path

from envbuild import __version__, attach, attest, provenance, sbom
from envbuild.docker import detect
from envbuild.registry import Registry
from envbuild.sign import TEST_RESULT_PREDICATE, public_key_of, sign_statement, statement
from securesystemslib.signer import CryptoSigner

LAYERS = ("torch", "engine", "verl")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locks", required=True, help="a combination's lock folder (torch.txt, engine.txt, verl.txt, tools.txt)")
    ap.add_argument("--dpkg", default="/var/lib/dpkg/status", help="dpkg status file standing in for the base's")
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--json", default=None, help="write the measurements here")
    a = ap.parse_args()

    locks = {p.stem: p.read_bytes() for p in sorted(Path(a.locks).glob("*.txt")) if p.stem != "full"}
    dpkg = Path(a.dpkg).read_bytes()
    osr = Path("/etc/os-release").read_bytes()
    eng = detect()
    repo = f"{a.registry}/envbuild-bench/attach-{secrets.token_hex(4)}"
    tag = f"{repo}:img"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, data in (("var/lib/dpkg/status", dpkg), ("etc/os-release", osr)):
            ti = tarfile.TarInfo(path)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    subprocess.run([eng.client, "import", "-", tag], input=buf.getvalue(), check=True, capture_output=True)
    pinned = eng.push(tag)
    name, digest = repo.split("/", 1)[1], pinned.split("@")[1]
    hexd = digest.split(":")[1]
    try:
        py = sbom.python_packages([(n, locks[n].decode()) for n in LAYERS if n in locks],
                                  locks["tools"].decode() if "tools" in locks else None)
        debs = sbom.parse_dpkg_status(dpkg.decode(errors="replace"))
        bom = statement(repo, hexd, sbom.PREDICATE_TYPE, sbom.cyclonedx(
            repo, hexd, py, debs, sbom.parse_os_release(osr.decode()), "2026-01-01T00:00:00Z", __version__))
        levels = {lv: {"status": "pass", "cause": None, "detail": "", "run_id": "20260101T000000-abcdef",
                       "created": "2026-01-01T00:00:00Z"} for lv in ("env", "contract", "gpu")}
        tr = statement(repo, hexd, TEST_RESULT_PREDICATE, {
            "result": "PASSED", "passedTests": [f"envbuild-probe/{lv}" for lv in levels], "warnedTests": [],
            "failedTests": [], "configuration": [
                {"name": "envbuild-combination", "annotations": {"id": Path(a.locks).name}},
                {"name": "lock", "digest": {"sha256": "0" * 64}},
                {"name": "envbuild-probe", "digest": {"sha256": "0" * 64}}],
            "envbuild": {"best_level": "gpu", "status": "verified", "levels": levels,
                         "timings": {"lock": 1.0, "render": 0.1, "build": 900.0, "push": 60.0, "probe": 300.0},
                         "run_ids": ["20260101T000000-abcdef"]}})
        prov = statement(repo, hexd, provenance.PREDICATE_TYPE, provenance.predicate(
            combo={"id": Path(a.locks).name}, dockerfile=b"x" * 4000, locks=locks,
            base={"kind": "nvidia", "ref": "nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", "digest": "sha256:" + "0" * 64,
                  "digest_kind": "registry"}, probe_sha256="0" * 64, content_hash="0" * 64, lock_hash="0" * 64,
            builder={"version": {"envbuild": __version__}}, run_id="20260101T000000-abcdef",
            started="2026-01-01T00:00:00Z", finished="2026-01-01T00:20:00Z"))
        signer = CryptoSigner.generate_ed25519()  # a throwaway key, written nowhere
        sizes = {k.name: len(attach._canon(sign_statement(s, signer))) for k, s in zip(attest.KINDS, (tr, bom, prov))}
        res = attach.attach_all(pinned, [tr, bom, prov], signer)
        seen = attest.describe(attest.verify_image(pinned, public_key_of(signer)))  # what `envbuild verify` prints
    finally:
        reg = Registry(a.registry)
        got = reg.get_manifest(name, attest.att_tag(digest))
        if got:
            reg.delete_manifest(name, got[0].digest)
        reg.delete_manifest(name, digest)
        eng.remove(tag, force=True)
    out = {"combination": Path(a.locks).name, "python_packages": len([p for p in py if p.env == "venv"]),
           "debian_packages": len(debs), "envelope_bytes": sizes, "bytes_added": res.bytes_added,
           "manifest_and_config_bytes": res.bytes_added - sum(sizes.values()), "referrers": res.referrers,
           "note": "real locks and dpkg list; the verdicts, timings and digests inside the test-result and "
                   "provenance statements are placeholders of realistic length"}
    print(f"{'attachment':<28}{'bytes':>10}")
    for k, v in sizes.items():
        print(f"{k + ' envelope':<28}{v:>10}")
    print(f"{'.att manifest + config':<28}{out['manifest_and_config_bytes']:>10}")
    print(f"{'total per image':<28}{res.bytes_added:>10}")
    print(f"({out['python_packages']} Python packages, {out['debian_packages']} Debian packages; "
          f"referrers API: {res.referrers})")
    print("\n".join(seen))
    out["verify_output"] = seen
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
