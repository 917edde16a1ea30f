"""Hostile input to `envbuild doctor`: one line and exit 2 (or a FAIL finding for a data path), never a
traceback, a hang or a memory blow-up."""

import os
import resource
import subprocess
import sys

import pytest

ONLY_CONFIG = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]


def doctor(*args, env=None, timeout=60):
    def limit():  # a blow-up fails the test instead of the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([sys.executable, "-m", "envbuild", "doctor", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env or os.environ.copy(), preexec_fn=limit)


def one_line_exit_2(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def _bomb(levels: int = 10) -> str:
    lines = ["  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "unknown_key:\n" + "\n".join(lines) + "\n"


def _chain(levels: int = 9, fan: int = 10) -> str:
    out = ["trainer:", "  l0: " + "x" * 100]
    for i in range(1, levels + 1):
        out.append(f"  l{i}: \"" + f"${{trainer.l{i - 1}}}" * fan + "\"")
    out.append(f"  project_name: ${{trainer.l{levels}}}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("name,content,needle", [
    ("deep.yaml", "a: " + "[" * 1000 + "]" * 1000 + "\n", "nested more than"),
    ("deepmap.yaml", "".join("  " * i + f"k{i}:\n" for i in range(500)) + "  " * 500 + "v: 1\n", "nested more than"),
    ("latin1.yaml", "trainer:\n  project_name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    ("bomb.yaml", _bomb(), "expands to more than"),
    ("chain.yaml", _chain(), "interpolations expand to more than"),
    ("cycle.yaml", "trainer:\n  project_name: ${trainer.experiment_name}\n  experiment_name: ${trainer.project_name}\n",
     "interpolation cycle"),
    ("tag.yaml", "trainer:\n  project_name: !!python/object:os.system [echo]\n", "tag"),
    ("big.yaml", "# " + "x" * (5 << 20) + "\n", "limit"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 20 else "")
def test_hostile_config_file(tmp_path, name, content, needle):
    f = tmp_path / name
    (f.write_bytes if isinstance(content, bytes) else f.write_text)(content)
    one_line_exit_2(doctor("--config", f, *ONLY_CONFIG), str(f), needle)


def test_fifo_and_device_as_config_file(tmp_path):
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    one_line_exit_2(doctor("--config", fifo, *ONLY_CONFIG), "not a regular file")
    one_line_exit_2(doctor("--config", "/dev/zero", *ONLY_CONFIG), "not a regular file")
    one_line_exit_2(doctor("--config", tmp_path, *ONLY_CONFIG), "not a regular file")


@pytest.mark.parametrize("override,needle", [
    ("trainer.logger=" + "[" * 3000 + "]" * 3000, "nested 3000 deep"),
    ("trainer.logger=" + "{a:" * 3000 + "1" + "}" * 3000, "nested 3000 deep"),
    ("trainer.project_name=" + "x" * 100_000, "longer than"),
    ("trainer.default_local_dir=${oc.env:ENVBUILD_SURELY_UNSET}/x", "ENVBUILD_SURELY_UNSET"),
    ("trainer.project_name=${no_such.key}", "no_such"),
], ids=["brackets", "braces", "long", "env", "missing-ref"])
def test_hostile_override(override, needle):
    one_line_exit_2(doctor(*ONLY_CONFIG, "--", override), needle)


def test_env_home_unset_is_an_error_not_none(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    p = doctor(*ONLY_CONFIG, "--", "trainer.default_local_dir=${oc.env:HOME}/x", env=env)
    one_line_exit_2(p, "trainer.default_local_dir", "HOME")
    assert "None/x" not in p.stdout + p.stderr


def test_fifo_and_device_as_data_files_are_findings_not_hangs(tmp_path):
    fifo = tmp_path / "train.parquet"
    os.mkfifo(fifo)
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")  # doctor reads a local model's config.json for the memory estimate
    skip = [g for x in ("output", "ray", "env") for g in ("--skip", x)]
    p = doctor(*skip, "--", f"data.train_files={fifo}", "data.val_files=/dev/zero",
               f"actor_rollout_ref.model.path={model}")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"FAIL  data.train_files[{fifo}]: {fifo} is not a regular file" in p.stdout
    assert "FAIL  data.val_files[/dev/zero]: /dev/zero is not a regular file" in p.stdout


def test_huge_numbers_and_bad_timeouts_are_one_line(run_cli):
    """Issue 27: a 5,000-digit override raised ValueError; --probe-timeout took -1 and nan."""
    p = run_cli("doctor", "--skip", "env", "--skip", "ray", "--", "trainer.nnodes=" + "9" * 5000)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "not a value verl can take" in p.stderr
    for bad in ("-1", "nan", "inf", "0"):
        q = run_cli("doctor", "--probe-timeout", bad)
        assert q.returncode == 2 and "positive number of seconds" in q.stderr, bad
