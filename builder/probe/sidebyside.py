"""The contract level in a process of its own, beside the gpu level.

The two import different things (contract: verl and every engine-facing module; gpu: the engine,
the tiny model, CUDA) and judge different things, so on a GPU node they need not wait for each
other: the child judges the contract level while this process starts the engine and trains. The
verdict is the one the levels give one after another: the contract level's checks come between
env's and gpu's, its level file is written as soon as the child ends (before gpu's), and with
--stop-at-failure a failed contract level drops the gpu level's checks, as if it had never run.
Asked for with --side-by-side; by default per engine (vocab.EngineSpec.side_by_side): on for vLLM,
whose engine start does not wait on verl's import (17.2-18.2 s against 20.8-20.9 s on the H200,
bench/probe_sidebyside_vllm_h200.json), and for hf on a row's venv, where verl's import (4.8-6.2 s)
was most of the contract level's time (cold medians 11.9 s against 15.7 s on an H100, 13.5 s
against 14.8 s on an H200: bench/probe_modes_h100.json, probe_modes_h200.json). The node's own
Python, without verl, had shown no gain for hf (bench/probe_ab_h200.json): its contract level was
then transformers, which the gpu level imports too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from .spawn import child_env, package
from .verdict import ERROR, Verdict, write_json
from .vocab import expect_argv
from .hardware import ACCELERATORS


def accelerator_node() -> bool:
    """Whether this machine has an accelerator's device files (hardware.AcceleratorKind.device_nodes)."""
    return any(os.path.exists(n) for k in ACCELERATORS.values() for n in k.device_nodes)


def wanted(choice: str) -> bool:
    """auto: on a GPU node (a device node present), one rank. Off a GPU node the gpu level is the
    CPU rehearsal of tests, and a second torch import would only take the other core."""
    if choice != "auto":
        return choice == "yes"
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        return False  # every rank would judge the contract level again
    return accelerator_node()


class ContractChild:
    def __init__(self, engine: str, expect: dict):
        self.tmp = tempfile.mkdtemp(prefix="envbuild-contract-")
        self.out = os.path.join(self.tmp, "contract.json")
        cmd = [sys.executable, "-m", package(), "--level", "contract", "--only", "contract", "--engine", engine,
               "--json", self.out, *expect_argv(expect)]
        # Its own session would outlive a killed probe; in this one, a timeout's kill takes it too.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=child_env(), cwd="/")
        self.thread: threading.Thread | None = None

    def fold_when_done(self, v: Verdict, levels_dir: str | None) -> None:
        """In a thread: wait for the child, fold its checks into v, write the contract level's file.
        v is not touched elsewhere until join() (the gpu level writes into a verdict of its own)."""
        def wait():
            _out, err = self.proc.communicate()
            try:
                with open(self.out) as f:
                    d = json.load(f)
            except (OSError, ValueError):
                with v.at_level("contract"):
                    v.add("contract-process", ERROR, f"the contract level's process ended with exit "
                          f"{self.proc.returncode} and no verdict: {(err or '').strip()[-1500:]}", "probe-error")
            else:
                v.absorb(d, prefix="contract")
            shutil.rmtree(self.tmp, ignore_errors=True)
            if levels_dir and int(os.environ.get("RANK", "0")) == 0:
                write_json(os.path.join(levels_dir, "contract.json"), v.to_dict(level="contract"))

        self.thread = threading.Thread(target=wait, name="probe-contract-level", daemon=True)
        self.thread.start()

    def join(self, v: Verdict) -> None:
        t0 = time.perf_counter()
        if self.thread is not None:
            self.thread.join()
        v.timings["contract_wait"] = round(time.perf_counter() - t0, 4)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
