#!/usr/bin/env python3
"""doctor on verl's own example scripts: WARNs and FAILs on correct examples (goal: 0 WARN, 0 FAIL
from doctor's own rules), and every start-up error verl raises caught before the job queues.

Reads the GRPO launch scripts of a verl git checkout at release tags (examples/grpo_trainer/*.sh,
`git show TAG:path`; nothing of verl is run) and judges each with `envbuild doctor SCRIPT --verl
RELEASE --json`, skipping the groups that read the machine (data files, output folders, Ray,
the env probe). Then, on one correct example per release, applies each error verl raises at
start-up and counts which doctor catches. Prints a table and writes JSON
(bench/doctor_examples.json by default).

  python bench/doctor_examples.py --verl-repo PATH [--release v0.6.1=0.6.1 --release v0.7.0=0.7.0]

With that verl release importable (PYTHONPATH, a venv), each script also goes through verl's own
start-up validation (config.verl_validate); otherwise it is skipped and counted as such.

A script whose command line does not parse as Hydra parses it (verl's own examples hold a few:
`<path_to_dsv3_config>`, a stray `}`) is counted as refused input, with doctor's one-line reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envbuild.verl_config import base_config

HERE = Path(__file__).resolve().parent
SKIP = [g for x in ("data", "output", "ray", "env") for g in ("--skip", x)]
A = "actor_rollout_ref."
# Errors verl raises at start-up (issue 50), each as overrides on a correct example, and the check
# that should catch it.
ERRORS = {
    "unknown adv_estimator": (["algorithm.adv_estimator=grpoo"], "config.choices"),
    "unknown rollout.name": ([A + "rollout.name=vllmm"], "config.choices"),
    "mini batch above train batch": (["data.train_batch_size=16", A + "actor.ppo_mini_batch_size=32"], "config.batches"),
    "micro batch given both ways": ([A + "actor.ppo_micro_batch_size=64"], "config.batches"),
    "no micro batch size": ([A + "actor.ppo_micro_batch_size_per_gpu=null", A + "actor.use_dynamic_bsz=False"],
                            "config.batches"),
    "tensor parallel above the GPUs": ([A + "rollout.tensor_model_parallel_size=16"], "config.parallel"),
    "misspelt key": (["trainer.n_gpu_per_node=8"], "config.keys"),
    "long prompts, batched-token limit (sync vLLM)": (
        ["data.max_prompt_length=8192", "data.max_response_length=8192", A + "rollout.mode=sync"], "config.token_limit"),
}


def scripts_at(repo: Path, tag: str, out: Path) -> list[Path]:
    names = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", f"{tag}:examples/grpo_trainer"],
                           capture_output=True, text=True, check=True).stdout.split()
    got = []
    for n in sorted(x for x in names if x.endswith(".sh")):
        p = out / tag / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(subprocess.run(["git", "-C", str(repo), "show", f"{tag}:examples/grpo_trainer/{n}"],
                                     capture_output=True, check=True).stdout)
        got.append(p)
    return got


def doctor(script: str, release: str, *extra: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "envbuild", "doctor", script, "--verl", release, "--json", *SKIP,
                        *(["--", *extra] if extra else [])], capture_output=True,
                       text=True, timeout=300)
    try:
        out = json.loads(p.stdout)
    except ValueError:
        return p.returncode, None, p.stderr.strip()
    if "checks" not in out:  # an error object: refused input
        return p.returncode, None, str(out.get("error") or out)[:300] or p.stderr.strip()
    return p.returncode, out, p.stderr.strip()


def judge_release(repo: Path, tag: str, release: str, work: Path) -> dict:
    rows, t0 = [], time.monotonic()
    for s in scripts_at(repo, tag, work):
        rc, out, err = doctor(str(s), release)
        if out is None:
            rows.append({"script": s.name, "exit": rc, "refused_input": err.splitlines()[-1:] or [""]})
            continue
        bad = [f"{c['status'].upper()} {c['name']}: {c['reason'][:160]}" for c in out["checks"]
               if c["status"] in ("fail", "warn")]
        own = next((c for c in out["checks"] if c["name"] == "config.verl_validate"), {})
        rows.append({"script": s.name, "exit": rc, "counts": out["counts"], "flagged": bad,
                     "verl_validate": own.get("status"),
                     "whole": all(c["status"] == "pass" for c in out["checks"] if c["name"] == "config.script")})
    judged = [r for r in rows if "counts" in r]
    # a correct example to break: the first plain FSDP one doctor passes that names the vLLM rollout
    # and takes nothing from the environment
    base = next((work / tag / r["script"] for r in judged if not r["flagged"] and r["whole"]
                 and "rollout.name=vllm" in (work / tag / r["script"]).read_text()
                 and "config-name" not in (work / tag / r["script"]).read_text()), None)
    caught = {}
    refuses = bool(base_config(release)[2]["refusals"])  # what doctor itself reads for this release
    if base is not None:
        for what, (extra, check) in ERRORS.items():
            if check == "config.token_limit" and not refuses:
                caught[what] = {"check": check, "status": "n/a", "reason": f"verl {release} does not raise it"}
                continue
            rc, out, err = doctor(str(base), release, *extra)
            got = {c["name"]: c for c in (out or {}).get("checks", [])}
            hit = got.get(check, {})
            caught[what] = {"check": check, "status": hit.get("status") or ("refused input" if out is None else "absent"),
                            "reason": (hit.get("reason") or err)[:200]}
    return {"tag": tag, "release": release, "scripts": len(rows), "judged": len(judged),
            "refused_input": [f"{r['script']}: {r['refused_input'][0][:160]}" for r in rows if "refused_input" in r],
            "with_warn": sum(1 for r in judged if r["counts"]["warn"]), "with_fail": sum(1 for r in judged if r["counts"]["fail"]),
            "warns": sum(r["counts"]["warn"] for r in judged), "fails": sum(r["counts"]["fail"] for r in judged),
            "flagged": {r["script"]: r["flagged"] for r in judged if r["flagged"]},
            # the installed verl's own validation (config.verl_validate) where verl imports here
            "verl_validate": {s: sum(1 for r in judged if r["verl_validate"] == s) for s in ("pass", "fail", "skip")},
            "errors_base": base.name if base else None, "errors": caught, "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verl-repo", required=True, type=Path, help="a git checkout (or bare mirror) of verl")
    ap.add_argument("--release", action="append", default=[], metavar="TAG=RELEASE",
                    help="judge the examples at TAG against the recorded RELEASE (default v0.6.1=0.6.1, v0.7.0=0.7.0)")
    ap.add_argument("--out", type=Path, default=HERE / "doctor_examples.json")
    args = ap.parse_args(argv)
    pairs = [r.split("=", 1) for r in (args.release or ["v0.6.1=0.6.1", "v0.7.0=0.7.0"])]
    with tempfile.TemporaryDirectory(prefix="envbuild-doctor-examples-") as td:
        results = [judge_release(args.verl_repo, tag, rel, Path(td)) for tag, rel in pairs]
    print(f"{'examples':<10} {'verl':<6} {'scripts':>7} {'judged':>6} {'w/ WARN':>7} {'w/ FAIL':>7} "
          f"{'errors caught':>13} {'verl own p/f/s':>14} {'s':>6}")
    for r in results:
        raised = [c for c in r["errors"].values() if c["status"] != "n/a"]
        caught = f"{sum(1 for c in raised if c['status'] == 'fail')}/{len(raised)}"
        print(f"{r['tag']:<10} {r['release']:<6} {r['scripts']:>7} {r['judged']:>6} {r['with_warn']:>7} "
              f"{r['with_fail']:>7} {caught:>13} {'/'.join(str(v) for v in r['verl_validate'].values()):>14} "
              f"{r['seconds']:>6}")
        for script, flags in r["flagged"].items():
            for f in flags:
                print(f"    {script}: {f}")
        for line in r["refused_input"]:
            print(f"    refused input: {line}")
        for what, c in r["errors"].items():
            if c["status"] not in ("fail", "n/a"):
                print(f"    not caught: {what} ({c['check']}: {c['status']})")
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
