"""doctor, config group: the installed verl's own start-up validation (doctor/verl_validate.py, in
a child process: it imports verl, hence torch and Ray). verl's own rules, in verl's words, before
the job waits in a queue; where verl is not installed here (a recorded release), doctor's
config checks stand in for it and this says so."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ..verl_config import VerlConfig
from .common import FAIL, PASS, SKIP, Options, Result

SCRIPT = Path(__file__).with_name("verl_validate.py")


def check_verl_validation(cfg: VerlConfig, opt: Options) -> Result:
    name = "config.verl_validate"
    if not cfg.installed:
        return Result("config", name, SKIP, f"{cfg.origin}: verl is not installed here, so its own validation "
                      "cannot run; the config checks above are read from its code and config instead")
    from ..probe_exec import run_bounded  # the one bounded child: its process group killed at the limit

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="envbuild-verl-config-") as f:
        json.dump({"config": cfg.resolved}, f, default=str)
        f.flush()
        try:
            rc, out, err, _ = run_bounded([sys.executable, str(SCRIPT), f.name], opt.probe_timeout, None,
                                          lambda p: None)
        except OSError as e:
            return Result("config", name, SKIP, f"could not start {sys.executable}: {e.strerror or e}")
    if rc is None:
        return Result("config", name, SKIP, f"verl's validation did not finish in {opt.probe_timeout:.0f}s "
                      "(importing verl, torch and Ray?): not judged", "raise --probe-timeout")
    lines = out.strip().splitlines()
    try:
        got = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return Result("config", name, SKIP, f"verl's validation wrote no result (exit {rc}): "
                      f"{tail[:300]}")
    fn = got.get("function") or "verl's validation"
    printed = got.get("printed") or []
    said = f"; verl printed: {' | '.join(printed)[:400]}" if printed else ""
    if got.get("status") == "fail":
        where = f" at {got['where']}" if got.get("where") else ""
        return Result("config", name, FAIL, f"{cfg.origin}: {fn} refuses this config{where}: "
                      f"{' '.join(str(got.get('error')).split())[:600]}",
                      "change what verl names; this is verl's own check, the one main_ppo runs before the "
                      "workers start", got)
    if got.get("status") == "pass":
        return Result("config", name, PASS, f"{cfg.origin}: {fn} accepts it (use_reference_policy="
                      f"{got.get('use_reference_policy')}, use_critic={got.get('use_critic')}){said}", details=got)
    return Result("config", name, SKIP, f"{cfg.origin}: verl's own validation could not run here: "
                  f"{got.get('error')}" + (f" ({got['where']})" if got.get("where") else ""), details=got)
