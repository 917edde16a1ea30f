"""`envbuild base bootstrap`: build (or reuse) the bootstrap base image (the command around
envbuild.base)."""

from __future__ import annotations

from .base import DEFAULT_SUITE, bootstrap
from .errors import EnvbuildError
from .probe.hardware import DEFAULT_PLATFORM, PLATFORMS, parse_platform


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="base_command", metavar="ACTION")
    b = sub.add_parser("bootstrap", help="debootstrap a minimal base with Python and import it")
    b.add_argument("--suite", default=DEFAULT_SUITE, help="distribution suite (default bookworm)")
    b.add_argument("--tag", help="image reference to create (default: envbuild/base:<suite>-py3-<input hash>)")
    b.add_argument("--mirror", help="distribution mirror (default: the one this host's apt uses)")
    b.add_argument("--platform", default=DEFAULT_PLATFORM, choices=list(PLATFORMS),
                   type=lambda v: parse_platform(v) or v,  # any spelling: arm64, aarch64, linux/arm64
                   help=f"the image's platform (default {DEFAULT_PLATFORM}); another than this host's "
                        "is built under qemu (ci/emulation.sh) and pushed to --registry")
    b.add_argument("--registry", metavar="HOST",
                   help="registry for a non-host platform's base, e.g. 127.0.0.1:5000 (its tag: "
                        "HOST/envbuild/base:<suite>-py3-<input hash>)")


def run(args) -> int:
    if getattr(args, "base_command", None) != "bootstrap":
        raise EnvbuildError("expected an action: bootstrap (envbuild base bootstrap --help)")
    from .docker import detect
    engine = detect()
    base = bootstrap(engine, suite=args.suite, tag=args.tag, mirror=args.mirror,
                     platform=args.platform, registry=args.registry)
    print(base.pinned)  # the host's: the tag, as always; another platform's: REGISTRY/...@sha256:
    return 0
