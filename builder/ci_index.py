"""`envbuild ci torch-index --cuda VARIANT`: the PyTorch index URL of one accelerator variant,
as the lock and the build use it (index.torch_index_url under index.pytorch_root: the
environment's ENVBUILD_PYTORCH_INDEX, else the matrix's `pytorch_index`, else the public
index). The nightly's build step exports it as the bake file's torch-index secret: with --export,
as `NAME=URL` under the variable the bake file names (index_config.torch_index_env)."""

from __future__ import annotations

from .errors import InputError
from .index_config import pytorch_root, torch_index_env, torch_index_url
from .matrix import matrix_from_args
from .probe.hardware import parse_variant


def add_arguments(p) -> None:
    p.add_argument("--matrix", default=None, help="matrix YAML whose `pytorch_index` applies (default: the bundled one)")
    p.add_argument("--cuda", required=True, help="accelerator variant: cu126 or 12.6, rocm6.2")
    p.add_argument("--export", action="store_true",
                   help="print NAME=URL, NAME being the variable the bake file reads the variant's secret from")


def run(args) -> int:
    var = parse_variant(args.cuda)
    if var is None or var.kind == "cpu":
        raise InputError("command line", None, "--cuda", args.cuda, "not an accelerator variant (cu126 or 12.6, rocm6.2)")
    url = torch_index_url(pytorch_root(matrix_from_args(args).pytorch_index), var.tag)
    print(f"{torch_index_env(var.tag)}={url}" if args.export else url)
    return 0
