"""Every axis value reaches every consumer (issue 51): each engine, accelerator kind and platform
descriptor is walked through the commands and modules that must know it, and each consumer is
asked through its own entry point (a flag parsed, a module classified, a variable named, a tag
listed). A consumer that keeps its own list instead of deriving from the descriptor fails here
the day a descriptor is added.

What it walks:
- engines (vocab.ENGINE_SPECS): the selector flag of every command, the probe's module
  ownership and optional-backend rule, doctor's rollout names and its rollout -> engine map, the
  probe's engine adapter and API checks, `pick`'s engine flag;
- accelerator kinds (hardware.ACCELERATORS): variant spellings round-trip, the per-variant secret
  `ci torch-index --export` exports under the name the bake file reads (index_config.torch_index_env,
  a shell identifier; tests/test_ci.py reads the bake file's), the probe's no-device
  classification, the host's device files and `docker run` arguments, the driver label, its driver
  table (drivers: doctor, the row's facts, pick, the page), its GPU names (the page's and doctor's)
  and the host's listing of its GPUs (host.gpus: doctor, in-place records);
- platforms (hardware.PLATFORM_SPECS): `--platform` in either spelling, the lock's wheel tags
  and uv platform, the combination id.
"""

from __future__ import annotations

import argparse
import re
from types import SimpleNamespace

import pytest

from envbuild.probe.hardware import (ACCELERATORS, DEFAULT_PLATFORM, PLATFORM_SPECS, parse_platform, parse_variant,
                                     variant_of)
from envbuild.probe.vocab import ENGINE_SPECS

SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _selectors(argv: list[str]):
    from envbuild.selector import add_selector_args, selectors_from_args

    p = argparse.ArgumentParser()
    add_selector_args(p)
    return selectors_from_args(p.parse_args(argv))


# ---------------------------------------------------------------- engines


@pytest.mark.parametrize("spec", ENGINE_SPECS, ids=lambda s: s.name)
def test_every_engine_reaches_every_consumer(spec):
    from envbuild.doctor.config import ROLLOUT_NAMES
    from envbuild.probe import engines as probe_engines
    from envbuild.probe.classify import classify_exception
    from envbuild.probe.vocab import engine_of_module, engine_of_rollout

    # the selector flag every command takes, and --engine NAME meaning the same
    flag = [f"--{spec.name}", "1.0"] if spec.versioned else [f"--{spec.name}"]
    by_flag, by_name = _selectors(flag), _selectors(["--engine", spec.name])
    assert by_flag.engine == by_name.engine == spec.name
    if spec.versioned:
        assert by_flag.engine_version == "1.0"
    # the probe: its modules are its own, and an image without them is never "not applicable"
    for m in spec.modules:
        assert engine_of_module(m) == spec.name, m
        missing = classify_exception(ModuleNotFoundError(f"No module named '{m}'", name=m), spec.name)
        assert missing.status == "fail", (m, missing)
    # doctor and verl's rollout.name: every prefix selects it, and doctor offers each
    assert spec.rollout, f"{spec.name}: no rollout name verl selects it by"
    for r in spec.rollout:
        assert engine_of_rollout(r) == spec.name and r in ROLLOUT_NAMES
    # the probe's engine adapter (gpu level) and its API contract checks (contract level)
    assert spec.name in probe_engines.ADAPTERS, f"probe/engines.py has no adapter for {spec.name}"
    assert probe_engines.ENGINES[spec.name] is probe_engines.ADAPTERS[spec.name].engine
    checks = probe_engines.api_checks(spec.name, on_gpu=False)
    assert isinstance(checks, list)


def test_pick_takes_every_engine_flag(tmp_path):
    from envbuild.pick import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    for spec in ENGINE_SPECS:
        argv = [f"--{spec.name}", "1.0"] if spec.versioned else [f"--{spec.name}"]
        ns = p.parse_args(argv)
        assert getattr(ns, spec.name) in ("1.0", True)


# ---------------------------------------------------------------- accelerator kinds


@pytest.mark.parametrize("kind", ACCELERATORS.values(), ids=lambda k: k.name)
def test_every_accelerator_kind_reaches_every_consumer(kind, capsys, monkeypatch, tmp_path):
    from envbuild import ci_index, host
    from envbuild.index_config import torch_index_env
    from envbuild.probe.classify import classify_exception

    version = "" if kind.name == "cpu" else ("6.2" if kind.name == "rocm" else "12.6")
    v = variant_of(kind.name, version)
    # every spelling of the variant is the variant
    assert parse_variant(v.tag) == v and parse_variant(v.label) == v if version else parse_variant(v.tag) == v
    # the per-variant secret: one variable name, a shell identifier, the one `ci torch-index` exports
    assert SHELL_NAME.match(torch_index_env(v.tag)), torch_index_env(v.tag)
    if version:
        monkeypatch.delenv("ENVBUILD_PYTORCH_INDEX", raising=False)
        ci_index.run(SimpleNamespace(matrix=None, cuda=v.tag, export=True))
        name, _, url = capsys.readouterr().out.strip().partition("=")
        assert name == torch_index_env(v.tag) and url.rstrip("/").endswith(v.index_path.rstrip("/"))
    # the probe: each of its "no device here" messages is needs-gpu, never broken
    for pattern, _why in kind.no_device:
        sample = re.sub(r"[\\()?|.*]", "", pattern.split("|")[0])
        got = classify_exception(RuntimeError(sample), "vllm")
        assert got.status == "needs-gpu", (kind.name, sample, got)
    # the host: its device files mean one is here (host.py asks every kind)
    if kind.device_nodes:
        present = {kind.device_nodes[0]}
        with monkeypatch.context() as m:
            m.setattr(host.os.path, "exists", lambda p: p in present)
            host.accelerator.cache_clear()
            try:
                assert host.accelerator() == kind and host.container_device_args() == list(kind.container_args)
            finally:
                host.accelerator.cache_clear()
    # what a reader calls its driver, wherever a kind has one
    assert bool(kind.driver_label) == (kind.name != "cpu")
    # its driver table answers through drivers.py for every spelling of the variant, and so does
    # the floor of its major; the label the readers print is the kind's
    from envbuild import drivers
    from envbuild.probe.hardware import Variant, gpu_names, parse_gpu

    for version, drv in kind.min_driver.items():
        v = Variant(kind.name, version)
        assert drivers.min_driver(v.tag) == drivers.min_driver(v.label) == drv
        assert drivers.driver_floor(v.tag) == kind.driver_floor.get(version.split(".")[0])
        assert drivers.driver_label(v.tag) == kind.driver_label
    # its GPU names are the page's and the readers' (`H100` -> `sm_90`)
    for name, number in kind.gpus.items():
        assert gpu_names()[name] == kind.arch_name(number)
    # the host lists its GPUs through the kind's own command (a stand-in of it on PATH)
    if kind.gpu_query:
        name, number = next(iter(kind.gpus.items()))
        exe = tmp_path / kind.gpu_query[0]
        exe.write_text(f"#!/bin/sh\necho '{name} 80GB, 999.1, {kind.arch_name(number)}'\n")
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert host.gpus() == [{"name": f"{name} 80GB", "driver": "999.1", "sm": number, "arch": kind.arch_name(number),
                                "kind": kind.name}]
        # and what a user calls it is that architecture, in pick, doctor and the page
        assert parse_gpu(name) == parse_gpu(kind.arch_name(number)) == kind.arch_name(number)


# ---------------------------------------------------------------- platforms


@pytest.mark.parametrize("spec", PLATFORM_SPECS, ids=lambda s: s.arch)
def test_every_platform_reaches_every_consumer(spec):
    from envbuild.lockmodel import ordered_wheel_tags, platform_tag
    from envbuild.values import Combo

    assert parse_platform(spec.name) == parse_platform(spec.arch) == spec.name
    assert _selectors(["--platform", spec.arch]).platform == spec.name
    tags = ordered_wheel_tags("3.12", "2.35", spec.name)
    assert tags and all(spec.machine in str(t) or str(t).endswith("-any") for t in tags)
    assert platform_tag("2.35", spec.name) == f"{spec.machine}-manylinux_2_35"
    cid = Combo("0.9.1", "hf", "", "2.11.0", "cu130", "3.12", platform=spec.name).id
    assert (spec.arch in cid) == (spec.name != DEFAULT_PLATFORM), cid


@pytest.mark.parametrize("kind", ACCELERATORS.values(), ids=lambda k: k.name)
def test_the_env_levels_library_checks_are_the_kinds_own(kind, tmp_path):
    """A torch of each kind gets the env level's GPU-library checks its descriptor lists
    (AcceleratorKind.env_checks) and every other one is said not checked, never run against the
    wrong kind's libraries nor called "a CPU build" (a stand-in torch of that kind, in a child)."""
    import json
    import subprocess
    import sys

    version = {"cuda": "12.6", "rocm": "6.2.41133", "cpu": ""}[kind.name]
    fake = tmp_path / "torch"
    fake.mkdir()
    attrs = {a: None for a in ("cuda", "hip")}
    if kind.torch_attr:
        attrs[kind.torch_attr] = version
    (fake / "__init__.py").write_text(
        "__version__ = '2.5.1'\n"
        f"class version:\n    cuda = {attrs['cuda']!r}\n    hip = {attrs['hip']!r}\n"
        "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n"
        # what cudnn and nccl ask of a CUDA build (no GPU needed)
        "class backends:\n    class cudnn:\n        version = staticmethod(lambda: 90100)\n"
        "class cuda:\n    class nccl:\n        version = staticmethod(lambda: (2, 21, 5))\n")
    code = ("import json\nfrom envbuild.probe.verdict import Verdict\nfrom envbuild.probe import env_level\n"
            "v = Verdict('env', 'hf')\nwith v.at_level('env'):\n    env_level.run_env(v, {}, 'hf')\n"
            "print(json.dumps({c.name: [c.status, c.detail] for c in v.checks}))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    checks = json.loads(p.stdout.splitlines()[-1])
    for name in ("cudnn", "nccl", "gpu-arch"):
        status, detail = checks[name]
        if name in kind.env_checks:
            assert status != "not-applicable", (name, detail)
        else:
            assert status == "not-applicable", (name, detail)
            assert ("CPU build" in detail) == (kind.name == "cpu") and (kind.label in detail or kind.name == "cpu")
