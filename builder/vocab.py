"""Host-side vocabulary: the probe's (descriptors per axis value, levels, statuses, exit codes)
re-exported, so the host and the probe in an image speak the same words. One home for each:
envbuild.probe.vocab."""

from __future__ import annotations

from .probe.vocab import (  # noqa: F401
    ACCELERATORS, CAVEATS, CHECK_STATUSES, CPU, DECISIVE, DEFAULT_PLATFORM, ENGINE, ENGINE_SPECS, ENGINES, ERROR,
    EXIT_BAD_INPUT, EXIT_INFRA, EXIT_OF_STATUS, EXIT_OK, EXIT_VERDICT, FAIL, FAILING, LEVELS, NEEDS_GPU,
    NEEDS_HOME, NEEDS_NETWORK, NOT_APPLICABLE, NOT_RUN, PASS, PLATFORM_SPECS, PLATFORMS, SKIPPED, TIMEOUT, UNDECIDED,
    VERDICT_STATUSES, VERSIONED_ENGINES, AcceleratorKind, EngineSpec, PlatformSpec, Variant, dist_of, engine_of_module,
    engine_of_rollout, host_platform, is_decisive, is_failing, level_index, level_rank, levels_upto,
    parse_platform, parse_variant, platform_arch, platform_machine, platform_spec, variant_of, variant_tag,
)

# `envbuild build --probe X` -> the probe levels run, in order (host-only words).
PROBE_CHOICES = ("none", "cpu", "gpu", "auto")
PROBE_PLAN = {"none": (), "cpu": ("env", "contract"), "gpu": LEVELS}
