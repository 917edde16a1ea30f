#!/usr/bin/env python3
"""Doctor speed: how long `envbuild doctor`'s checks take on realistic inputs.

Prints a table and writes JSON (bench/doctor_speed.json by default):
  - the data check on GSM8K-shaped parquet files of 10k, 100k and 1M rows (goal: <= 5 s for 1M rows,
    so checking a dataset never costs more than a fraction of a trainer's start-up)
  - the output-directory check (goal: <= 0.1 s)
  - the config-only checks (keys, types, GRPO, FSDP) without a GPU query (goal: <= 0.05 s)

  python bench/doctor_speed.py [--rows 10000,100000,1000000] [--out bench/doctor_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOALS = {"data_1m_s": 5.0, "output_s": 0.1, "config_s": 0.05}


def make_parquet(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt = pa.array([[{"role": "user", "content": f"Natalia sold clips to {i} friends in April... "
                                                     "How many clips did Natalia sell altogether?"}]
                       for i in range(rows)])
    pq.write_table(pa.table({
        "data_source": pa.array(["openai/gsm8k"] * rows),
        "prompt": prompt,
        "reward_model": pa.array([{"ground_truth": str(i), "style": "rule"} for i in range(rows)]),
        "extra_info": pa.array([{"index": i, "split": "train"} for i in range(rows)]),
    }), path)


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="10000,100000,1000000")
    ap.add_argument("--out", default=str(HERE / "doctor_speed.json"))
    args = ap.parse_args()

    from envbuild.doctor import Options, check_config, check_fsdp, check_grpo
    from envbuild.doctor.data import check_parquet
    from envbuild.doctor.output import check_writable
    from envbuild.verl_config import build_config

    rows_list = [int(x) for x in args.rows.split(",")]
    results: dict = {"data": [], "goals": GOALS}
    with tempfile.TemporaryDirectory() as td:
        for rows in rows_list:
            p = Path(td) / f"train_{rows}.parquet"
            make_parquet(p, rows)
            cfg = build_config(None, [f"data.train_files={p}", "data.train_batch_size=256"])
            secs, r = best_of(lambda: check_parquet(str(p), "data.train_files", "prompt", "data_source", cfg))
            assert r.status == "pass", r.reason
            results["data"].append({"rows": rows, "mb": round(p.stat().st_size / 1e6, 1), "seconds": round(secs, 4)})
        results["output_s"] = round(best_of(lambda: check_writable(os.path.join(td, "ckpt", "run"),
                                                                    "trainer.default_local_dir"))[0], 4)
    overrides = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8",
                 "actor_rollout_ref.actor.use_kl_loss=True", "algorithm.norm_adv_by_std_in_grpo=True",
                 "actor_rollout_ref.actor.fsdp_config.param_offload=True", "trainer.n_gpus_per_node=8"]
    opt = Options(gpus=lambda: [])

    def config_checks():
        cfg = build_config(None, overrides)
        return check_config(cfg, opt) + check_grpo(cfg, opt) + check_fsdp(cfg, opt)

    results["config_s"] = round(best_of(config_checks, 10)[0], 6)

    print(f"{'check':<28}{'input':>16}{'seconds':>10}{'goal':>8}")
    for d in results["data"]:
        goal = GOALS["data_1m_s"] if d["rows"] == 1_000_000 else ""
        print(f"{'data (parquet)':<28}{str(d['rows']) + ' rows':>16}{d['seconds']:>10.3f}{goal:>8}")
    print(f"{'output (atomic write)':<28}{'1 dir':>16}{results['output_s']:>10.3f}{GOALS['output_s']:>8}")
    print(f"{'config + grpo + fsdp':<28}{str(len(overrides)) + ' overrides':>16}{results['config_s']:>10.4f}"
          f"{GOALS['config_s']:>8}")
    big = [d for d in results["data"] if d["rows"] == 1_000_000]
    results["met"] = {"data_1m": (big[0]["seconds"] <= GOALS["data_1m_s"]) if big else None,
                      "output": results["output_s"] <= GOALS["output_s"],
                      "config": results["config_s"] <= GOALS["config_s"]}
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
