"""`envbuild doctor` data and output checks on real parquet files and real directories."""

import json
import os
import pickle
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyarrow.compute")  # imported before the fork: nobody cannot read root's site-packages

from envbuild.doctor import FAIL, PASS, SKIP, WARN, check_data  # noqa: E402
from envbuild.doctor.data import check_parquet  # noqa: E402
from envbuild.doctor.output import check_writable  # noqa: E402
from envbuild.verl_config import build_config  # noqa: E402


def chat(text):
    return [{"role": "user", "content": text}]


def write(path, columns: dict):
    pq.write_table(pa.table(columns), path)
    return path


def good_columns(n):
    return {"data_source": ["openai/gsm8k"] * n, "prompt": [chat(f"What is {i}+{i}?") for i in range(n)],
            "reward_model": [{"ground_truth": str(2 * i), "style": "rule"} for i in range(n)],
            "extra_info": [{"index": i} for i in range(n)]}


def parquet_check(path, *overrides):
    cfg = build_config(None, [f"data.train_files={path}", *overrides])
    return check_parquet(str(path), "data.train_files", cfg.get("data.prompt_key"), cfg.get("data.reward_fn_key"), cfg)


def test_good_parquet_passes_with_row_count_and_sample(tmp_path):
    r = parquet_check(write(tmp_path / "train.parquet", good_columns(40)), "data.train_batch_size=8")
    assert r.status == PASS, r.reason
    assert r.details["rows"] == 40 and "40 rows" in r.reason
    assert "What is 0+0?" in r.details["sample"]["prompt"]
    assert r.details["empty_fraction"] == {"prompt": 0.0, "data_source": 0.0, "reward_model": 0.0, "extra_info": 0.0}


def test_empty_parquet_fails(tmp_path):
    schema = pa.schema([("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])
    p = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), p)
    r = parquet_check(p)
    assert r.status == FAIL and "0 rows" in r.reason


def test_wrong_prompt_column_fails_and_suggests_the_key(tmp_path):
    cols = good_columns(10)
    cols["question"] = cols.pop("prompt")
    r = parquet_check(write(tmp_path / "q.parquet", cols), "data.train_batch_size=4")
    assert r.status == FAIL and "no column 'prompt'" in r.reason and r.fix == "set data.prompt_key=question"
    # ... and the same file passes once prompt_key points at it
    assert parquet_check(tmp_path / "q.parquet", "data.prompt_key=question", "data.train_batch_size=4").status == PASS


def test_null_dominated_columns_fail(tmp_path):
    cols = good_columns(10)
    cols["prompt"] = [chat("hi")] * 3 + [None] * 4 + [[]] * 3
    r = parquet_check(write(tmp_path / "nulls.parquet", cols), "data.train_batch_size=2")
    assert r.status == FAIL and "prompt 70% null/empty" in r.reason
    cols = good_columns(10)
    cols["reward_model"] = [{"ground_truth": "", "style": None}] * 8 + cols["reward_model"][:2]
    r = parquet_check(write(tmp_path / "gt.parquet", cols), "data.train_batch_size=2")
    assert r.status == FAIL and "reward_model 80% null/empty" in r.reason
    cols = good_columns(10)
    cols["data_source"] = [""] * 6 + [None] * 1 + ["gsm8k"] * 3
    r = parquet_check(write(tmp_path / "ds.parquet", cols), "data.train_batch_size=2")
    assert r.status == FAIL and "data_source 70% null/empty" in r.reason


def test_some_nulls_and_string_prompts_warn(tmp_path):
    cols = good_columns(10)
    cols["prompt"] = [None] + cols["prompt"][1:]
    r = parquet_check(write(tmp_path / "one_null.parquet", cols), "data.train_batch_size=2")
    assert r.status == WARN and "10.0% of 'prompt' null/empty" in r.reason
    cols = good_columns(10)
    cols["prompt"] = [f"question {i}" for i in range(10)]
    r = parquet_check(write(tmp_path / "str.parquet", cols), "data.train_batch_size=2")
    assert r.status == WARN and "not a list of chat messages" in r.reason
    bare = write(tmp_path / "bare.parquet", {"prompt": good_columns(4)["prompt"]})
    r = parquet_check(bare, "data.train_batch_size=2")
    assert r.status == WARN and "data_source" in r.reason


def test_fewer_rows_than_the_batch_fails(tmp_path):
    r = parquet_check(write(tmp_path / "small.parquet", good_columns(100)), "data.train_batch_size=256")
    assert r.status == FAIL and "zero steps" in r.reason


def test_missing_directory_and_garbage_files_fail(tmp_path):
    assert "does not exist" in parquet_check(tmp_path / "nope.parquet").reason
    assert "is a directory" in parquet_check(tmp_path).reason
    junk = tmp_path / "junk.parquet"
    junk.write_text("not,a,parquet\n1,2,3\n")
    r = parquet_check(junk)
    assert r.status == FAIL and "not a readable parquet file" in r.reason


def test_check_data_walks_train_and_val_lists(tmp_path):
    a = write(tmp_path / "a.parquet", good_columns(8))
    b = write(tmp_path / "b.parquet", good_columns(8))
    cfg = build_config(None, [f"data.train_files=[{a},{b}]", "data.val_files=null", "data.train_batch_size=4"])
    res = check_data(cfg, None)
    assert [(r.name, r.status) for r in res] == [
        (f"data.train_files[{a}]", PASS), (f"data.train_files[{b}]", PASS), ("data.val_files", SKIP)]
    res = check_data(build_config(None, ["data.val_files=null"]), None)  # train_files left at verl's example
    assert res[0].status == WARN and "example default" in res[0].reason


# --------------------------------------------------------------------------- as a non-root user


def as_nobody(fn, *args):
    """Run fn(*args) in a forked child that dropped root for `nobody`: the kernel's real permission checks."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to the nobody user")
    nobody = pwd.getpwnam("nobody")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            data = pickle.dumps(fn(*args))
        except BaseException as e:  # report, never return into pytest in the child
            data, code = pickle.dumps(e), 1
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    out = pickle.loads(data)
    if os.waitstatus_to_exitcode(status) != 0:
        raise out
    return out


@pytest.fixture
def shared_tmp():
    """A folder nobody can traverse (pytest's tmp_path sits under root's 0700 folder)."""
    d = Path(tempfile.mkdtemp(prefix="envbuild-doctor-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _check_with(cfg, path):
    return check_parquet(str(path), "data.train_files", cfg.get("data.prompt_key"), cfg.get("data.reward_fn_key"), cfg)


def test_unreadable_parquet_fails_for_a_non_root_user(shared_tmp):
    p = write(shared_tmp / "secret.parquet", good_columns(4))
    p.chmod(0o600)
    # The trainer config is composed before dropping root: envbuild's own files may sit in a
    # folder only root can read (a CI checkout in a 0700 temp dir); the data file is what is tested.
    cfg = build_config(None, [f"data.train_files={p}"])
    r = as_nobody(_check_with, cfg, p)
    assert r.status == FAIL and "not readable by this user" in r.reason
    p.chmod(0o644)
    cfg = build_config(None, [f"data.train_files={p}", "data.train_batch_size=2"])
    assert as_nobody(_check_with, cfg, p).status == PASS


def test_output_dir_without_write_permission_fails_as_non_root(shared_tmp):
    locked = shared_tmp / "locked"
    locked.mkdir(mode=0o755)  # owned by root, not writable by nobody
    r = as_nobody(check_writable, str(locked / "ckpt" / "run1"), "trainer.default_local_dir")
    assert r.status == FAIL and "mkdir failed" in r.reason and "Permission denied" in r.reason
    r = as_nobody(check_writable, str(locked), "trainer.default_local_dir")
    assert r.status == FAIL and "write failed" in r.reason
    assert not (locked / "ckpt").exists()
    open_dir = shared_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = as_nobody(check_writable, str(open_dir / "a" / "b"), "trainer.default_local_dir")
    assert r.status == PASS and "GiB free" in r.reason
    assert list(open_dir.iterdir()) == []  # created folders and the test file are gone again


def test_writable_dir_leaves_nothing_behind(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    r = check_writable(str(tmp_path), "trainer.default_local_dir")
    assert r.status == PASS and r.details["free"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    f = tmp_path / "file"
    f.write_text("")
    r = check_writable(str(f / "sub"), "trainer.default_local_dir")
    assert r.status == FAIL and "not a directory" in r.reason
    big = check_writable(str(tmp_path), "trainer.default_local_dir", need_bytes=1 << 60)
    assert big.status == WARN and "one checkpoint needs roughly" in big.reason


def test_cli_end_to_end_exit_status_and_json(tmp_path, run_cli):
    good = write(tmp_path / "train.parquet", good_columns(16))
    empty = tmp_path / "val.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.list_(pa.struct([("role", pa.string()),
                                                                         ("content", pa.string())])))}), empty)
    args = ["doctor", "--skip", "env", "--skip", "ray", "--json", "--", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=True",
            "algorithm.norm_adv_by_std_in_grpo=False", f"data.train_files={good}", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # verl refuses a mini batch above the batch
            # ... and a run without micro batch sizes (verl's defaults leave them unset)
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    p = run_cli(*args, "data.val_files=null")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is True and out["counts"]["fail"] == 0
    assert out["config"]["actor_rollout_ref.rollout.n"] == 4 and out["config"]["data.val_files"] is None
    names = {c["name"]: c for c in out["checks"]}
    assert names[f"data.train_files[{good}]"]["details"]["rows"] == 16
    assert names["trainer.default_local_dir"]["status"] == PASS
    p = run_cli(*args, f"data.val_files={empty}")
    assert p.returncode == 1
    bad = [c for c in json.loads(p.stdout)["checks"] if c["status"] == FAIL]
    assert [c["name"] for c in bad] == [f"data.val_files[{empty}]"] and "0 rows" in bad[0]["reason"]
    p = run_cli(*[a for a in args if a != "--json"], f"data.val_files={empty}")  # human output
    assert p.returncode == 1 and "FAIL  data.val_files" in p.stdout and "sample prompt:" in p.stdout
    assert p.stdout.strip().splitlines()[-1].startswith("envbuild doctor: 1 fail")


def test_corrupt_pages_behind_a_valid_footer_fail(tmp_path):
    p = write(tmp_path / "t.parquet", good_columns(2000))
    raw = bytearray(p.read_bytes())
    for i in range(100, len(raw) // 2):  # trash the data pages, keep magic bytes and footer
        raw[i] = 0xFF
    p.write_bytes(bytes(raw))
    r = parquet_check(p, "data.train_batch_size=2")
    assert r.status == FAIL and "rows cannot be read" in r.reason
