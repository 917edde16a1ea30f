"""doctor, data group: the parquet files verl will read."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..verl_config import VerlConfig
from .common import (FAIL, PASS, SKIP, WARN, Options, Result, _as_list)

# Columns verl's RLHFDataset and default reward managers read, besides the prompt column.
READ_COLUMNS = ("reward_model", "extra_info")
DOMINATED = 0.5  # a column more than half null/empty carries no signal for the trainer


def check_data(cfg: VerlConfig, opt: Options) -> list[Result]:
    out: list[Result] = []
    prompt_key = cfg.get("data.prompt_key") or "prompt"
    reward_key = cfg.get("data.reward_fn_key") or "data_source"
    for key in ("data.train_files", "data.val_files"):
        files = _as_list(cfg.get(key))
        if not files:
            status = FAIL if key == "data.train_files" else SKIP
            out.append(Result("data", key, status, f"{key} is empty",
                              f"set {key}=/path/to/file.parquet" if status == FAIL else ""))
            continue
        if not cfg.is_explicit(key) and key == "data.train_files":
            out.append(Result("data", key, WARN, f"{key} left at verl's example default {files}",
                              f"set {key} to your dataset"))
        for f in files:
            out.append(check_parquet(str(f), key, prompt_key, reward_key, cfg))
    return out


def check_parquet(path: str, key: str, prompt_key: str, reward_key: str, cfg: VerlConfig) -> Result:
    name = f"{key}[{path}]"
    if re.match(r"^[a-z][a-z0-9+]*://", path):
        return Result("data", name, SKIP, f"remote path {path} not checked here", "")
    p = Path(path).expanduser().absolute()  # verl resolves relative paths against its working directory
    if not p.exists():
        return Result("data", name, FAIL, f"{p} does not exist", f"fix {key} or create the file")
    if p.is_dir():
        return Result("data", name, FAIL, f"{p} is a directory; verl expects parquet files",
                      f"list the files: {key}=[{p}/a.parquet,{p}/b.parquet]")
    if not p.is_file():  # a FIFO would block the reader forever, a device would stream without end
        return Result("data", name, FAIL, f"{p} is not a regular file; verl expects parquet files",
                      f"point {key} at a parquet file")
    if not os.access(p, os.R_OK):
        return Result("data", name, FAIL, f"{p} is not readable by this user (uid {os.getuid()})",
                      f"chmod a+r {p}")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return Result("data", name, WARN, "pyarrow is not installed: parquet content not checked",
                      "pip install pyarrow (verl's datasets need it anyway)")
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:  # ArrowInvalid, OSError: anything that keeps verl from reading it
        return Result("data", name, FAIL, f"{p} is not a readable parquet file: {str(e).splitlines()[0][:200]}",
                      "regenerate it (e.g. with verl's examples/data_preprocess scripts)")
    rows = pf.metadata.num_rows
    cols = pf.schema_arrow.names
    details: dict = {"rows": rows, "columns": cols}
    if rows == 0:
        return Result("data", name, FAIL, f"{p} has 0 rows: training would run zero steps",
                      "regenerate the dataset", details)
    if prompt_key not in cols:
        guess = [c for c in cols if c.lower() in ("prompt", "question", "problem", "query", "messages", "input")]
        fix = f"set data.prompt_key={guess[0]}" if guess else "set data.prompt_key to the prompt column"
        return Result("data", name, FAIL, f"{p} has no column {prompt_key!r} (data.prompt_key); columns: {cols}",
                      fix, details)
    read = [prompt_key] + [c for c in (reward_key, *READ_COLUMNS) if c in cols and c != prompt_key]
    try:
        empty = _empty_fractions(pf, read)
        details["sample"] = _sample(pf, read)
    except Exception as e:  # a valid footer over corrupt pages: verl would fail mid-epoch
        return Result("data", name, FAIL, f"{p}: rows cannot be read: {str(e).splitlines()[0][:200]}",
                      "regenerate the file", details)
    details["empty_fraction"] = empty
    problems = [f"{c} {empty[c]:.0%} null/empty" for c in read if empty[c] > DOMINATED]
    summary = f"{rows} rows, columns {cols}"
    if problems:
        return Result("data", name, FAIL, f"{summary}; dominated by nulls/empty: {', '.join(problems)}",
                      "drop or fix those rows before training", details)
    notes = []
    if empty[prompt_key] > 0:
        notes.append(f"{empty[prompt_key]:.1%} of {prompt_key!r} null/empty")
    missing = [c for c in (reward_key, "reward_model") if c not in cols]
    if missing and key == "data.train_files":
        notes.append(f"no column {missing} (verl's default reward managers read {reward_key!r} and "
                     "reward_model.ground_truth)")
    ptype = str(pf.schema_arrow.field(prompt_key).type)
    if not ptype.startswith(("list", "large_list")):
        notes.append(f"{prompt_key!r} is {ptype}, not a list of chat messages [{{role, content}}] as RLHFDataset "
                     "expects")
    bs = cfg.get("data.train_batch_size")
    if key == "data.train_files" and isinstance(bs, int) and rows < bs:
        return Result("data", name, FAIL,
                      f"{rows} rows < data.train_batch_size={bs}: the dataloader drops the last partial batch, "
                      "so an epoch has zero steps", "lower data.train_batch_size or add rows", details)
    if notes:
        return Result("data", name, WARN, f"{summary}; " + "; ".join(notes),
                      "fix the dataset or point data.prompt_key / data.reward_fn_key at the right columns", details)
    return Result("data", name, PASS, summary, details=details)


def _is_empty(v: Any) -> bool:
    return v is None or (isinstance(v, (str, list, dict, bytes)) and len(v) == 0)


def _empty_fractions(pf, columns: list[str]) -> dict[str, float]:
    """Share of rows whose value is null or empty (string, list, struct with all-null fields)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = dict.fromkeys(columns, 0)
    total = 0
    for batch in pf.iter_batches(columns=columns, batch_size=65536):
        total += batch.num_rows
        for c in columns:
            arr = batch.column(c)
            t = arr.type
            mask = pc.is_null(arr)
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                mask = pc.or_(mask, pc.equal(pc.utf8_length(pc.fill_null(arr, "")), 0))
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                mask = pc.or_(mask, pc.equal(pc.fill_null(pc.list_value_length(arr), 0), 0))
            elif pa.types.is_struct(t) and t.num_fields:
                # reward_model: {ground_truth, style}: empty when every field is null/empty
                sub = [pc.struct_field(arr, [i]) for i in range(t.num_fields)]
                allnull = None
                for s in sub:
                    e = pc.is_null(s)
                    if pa.types.is_string(s.type) or pa.types.is_large_string(s.type):
                        e = pc.or_(e, pc.equal(pc.utf8_length(pc.fill_null(s, "")), 0))
                    allnull = e if allnull is None else pc.and_(allnull, e)
                mask = pc.or_(mask, allnull)
            bad[c] += pc.sum(pc.cast(pc.fill_null(mask, True), pa.int64())).as_py() or 0
    return {c: (bad[c] / total if total else 1.0) for c in columns}


def _sample(pf, columns: list[str]) -> dict:
    batch = next(pf.iter_batches(columns=columns, batch_size=1))
    row = batch.to_pylist()[0]
    return {k: (repr(v)[:300]) for k, v in row.items()}
