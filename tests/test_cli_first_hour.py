"""The first hour (issue 28): a mistyped command or flag gets a "did you mean", an error under
--json is JSON on stdout, and each is one line on stderr with exit 2."""

import json


def test_mistyped_command_and_flag(run_cli):
    p = run_cli("plna")
    assert p.returncode == 2 and "unknown command 'plna' (did you mean 'plan'?)" in p.stderr
    q = run_cli("plan", "--verll", "0.4.1")
    assert q.returncode == 2 and q.stderr.splitlines()[0] == "envbuild plan: unknown flag '--verll' (did you mean --verl?)"
    assert "usage: envbuild plan" in q.stderr  # the command's usage, not the top level's
    r = run_cli("doctor", "--skip", "env", "--", "trainer.nnodes=1", "--verll")  # after --: overrides, not flags
    assert "unknown flag" not in r.stderr


def test_an_error_under_json_is_json(run_cli):
    p = run_cli("lock", "--json", "--vllm", "9.9", "--out", "/nonexistent-envbuild")
    assert p.returncode == 2
    err = json.loads(p.stdout)["error"]
    assert err["command"] == "lock" and err["exit_code"] == 2 and "--vllm='9.9'" in err["message"]


def test_an_unwritable_output_is_one_line_naming_the_path(run_cli, tmp_path):
    """Issue 27: unwritable output paths raised tracebacks (exit 1, the code of a verdict)."""
    f = tmp_path / "a-file"
    f.write_text("")
    bad = f / "sub"  # a file where a folder belongs
    for args in (["keygen", "--out", bad], ["ci", "github", "--out", bad],
                 ["render", "--verl", "0.4.1", "--hf", "--cuda", "cu124", "--out", bad],
                 ["discover", "--write", bad / "p.yaml"]):
        # render locks into ./locks first: a folder of its own, never the checkout's
        p = run_cli(*args, cwd=tmp_path if args[0] == "render" else None)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr[-500:])
        assert str(bad) in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_build_says_what_it_would_build_and_asks_above_one_image(run_cli):
    p = run_cli("build", "--dry-run", "--cuda", "cu126", "--vllm", "0.8.4")
    assert p.returncode == 0 and p.stdout.startswith("envbuild build --dry-run: 3 image(s), up to ~26 GB")
    assert "verl0.4.1-vllm0.8.4-torch2.6.0-cu126-py3.11" in p.stdout
    j = json.loads(run_cli("build", "--dry-run", "--json", "--cuda", "cu126", "--vllm", "0.8.4").stdout)  # issue 50
    assert j["images"] == 3 and "verl0.4.1-vllm0.8.4-torch2.6.0-cu126-py3.11" in [c["id"] for c in j["combinations"]]
    # the headline itself plans three images: no terminal, no --yes, refused before anything starts
    q = run_cli("build", "--cuda", "cu126", "--vllm", "0.8.4")
    assert q.returncode == 2 and "pass --yes" in q.stderr and len(q.stderr.strip().splitlines()) == 1
    assert "3 image(s), up to ~26 GB" in q.stderr


def test_an_unreachable_pytorch_index_is_one_question_with_the_fix(run_cli, tmp_path, isolated_cache):
    import time
    t0 = time.monotonic()
    p = run_cli("lock", "--cuda", "cu126", "--vllm", "0.8.4", "--out", tmp_path,
                env={"ENVBUILD_PYTORCH_INDEX": "http://127.0.0.1:9/whl", "ENVBUILD_CACHE": str(isolated_cache)})
    assert p.returncode == 3 and time.monotonic() - t0 < 20
    assert p.stdout.count("the PyTorch index http://127.0.0.1:9/whl/cu126 did not answer: set") == 3
    assert "ENVBUILD_PYTORCH_INDEX" in p.stdout and "uv resolutions run" not in p.stderr


def test_a_long_lock_says_it_is_alive_when_piped(capsys):
    """Issue 28: piped, `lock` was silent for 25-35 s. A plain stderr line now, no escape codes."""
    import time

    from envbuild.progress import Progress
    with Progress("lock", 2, "combinations", every=0.2) as prog:
        prog.wrap(lambda: time.sleep(0.7), "verl0.4.1-hf")()
    err = capsys.readouterr().err
    assert "lock: 0/2 combinations done" in err and "running verl0.4.1-hf (0s)" in err and "\x1b" not in err
