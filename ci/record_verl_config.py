#!/usr/bin/env python3
"""Record verl's composed trainer config per verl release, for `envbuild doctor` without verl.

For each verl release of the matrix (or those named): `pip download --no-deps verl==X`, take
verl/trainer/config/ out of the wheel, compose `ppo_trainer` and `ppo_megatron_trainer` (what
`--config-name` picks in verl's Megatron examples) with Hydra exactly as doctor does for an
installed verl (envbuild.verl_config.compose_trainer_config), and write matrix/verl_config/X.json:
{verl, source: {wheel, sha256}, configs: {name: config}, choices, refusals} (choices: the values
verl's code accepts for its enum-valued keys, envbuild.verl_choices; refusals: what its rollout
refuses at start-up from the config alone, envbuild.verl_refusals). Unresolved interpolations stay
as strings; JSON keeps YAML 1.2 floats as floats. Never edit these by hand.

    python3 ci/record_verl_config.py [--check] [VERSION ...]

--check: compose again and exit 1 if any recorded file differs (or is missing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from envbuild.matrix import load_matrix
from envbuild.paths import data_dir, default_matrix
from envbuild.verl_choices import SOURCES, choices_of_tree
from envbuild.verl_config import CONFIG_NAME, compose_trainer_config
from envbuild.verl_refusals import refusals_of_tree, wheel_members

PREFIX = "verl/trainer/config/"
CONFIG_NAMES = (CONFIG_NAME, "ppo_megatron_trainer")


def record(version: str, work: Path) -> dict:
    dl = work / f"dl-{version}"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "-d", str(dl), f"verl=={version}"], check=True)
    [wheel] = sorted(dl.glob("verl-*.whl"))
    out = work / f"cfg-{version}"
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".." not in name and ((name.startswith(PREFIX) and name.endswith(".yaml")) or name in SOURCES
                                     or wheel_members(name)):
                z.extract(name, out)
    configs = {n: compose_trainer_config(out / PREFIX, n) for n in CONFIG_NAMES if (out / PREFIX / f"{n}.yaml").is_file()}
    return {"verl": version, "source": {"wheel": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
            "configs": configs, "choices": choices_of_tree(out), "refusals": refusals_of_tree(out)}


def dump(rec: dict) -> str:
    return json.dumps(rec, indent=None, separators=(",", ":"), sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", help="verl releases (default: the matrix's)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a recorded file is missing or differs")
    args = ap.parse_args(argv)
    versions = args.versions or load_matrix(default_matrix()).verl
    dest = data_dir("matrix") / "verl_config"
    dest.mkdir(exist_ok=True)
    stale = []
    with tempfile.TemporaryDirectory(prefix="envbuild-verl-config-") as td:
        for v in versions:
            text = dump(record(v, Path(td)))
            path = dest / f"{v}.json"
            old = path.read_text() if path.exists() else None
            if args.check:
                if old != text:
                    stale.append(v)
                print(f"{v}: {'ok' if old == text else 'DIFFERS'}")
                continue
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(text)
            tmp.replace(path)
            print(f"{v}: {path} ({len(text)} bytes{', unchanged' if old == text else ''})")
    if stale:
        print(f"stale: {', '.join(stale)}; run python3 ci/record_verl_config.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
