"""The oldest NVIDIA Linux driver that runs each CUDA toolkit: the one home of this fact.

Numbers from NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver
Versions" (Linux x86_64, the toolkit's GA release). Within one CUDA major version, "minor
version compatibility" lets an older driver of that major run newer minor toolkits (from the
floor below), minus features that need the newer driver (e.g. PTX JIT of newer PTX); data-center
GPUs can also run a newer toolkit on an older driver with the forward-compatibility package
(cuda-compat). The table page shows both, next to the row's CUDA.
"""

from __future__ import annotations

from .probe.hardware import parse_variant

MIN_DRIVER_LINUX = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# Minor version compatibility: the floor for any toolkit of that major version.
MINOR_COMPAT_FLOOR = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}

FORWARD_COMPAT_NOTE = ("An older driver of the same CUDA major version (at least {floor}) runs this "
                       "toolkit through minor version compatibility, minus features that need the newer "
                       "driver; data-center GPUs can use the forward-compatibility package (cuda-compat) "
                       "for a newer toolkit on an older driver.")


# The driver tables per accelerator kind (hardware.ACCELERATORS): ROCm's would go beside CUDA's.
MIN_DRIVER = {"cuda": MIN_DRIVER_LINUX}


def min_driver(spelling: object) -> str | None:
    """The oldest driver for a variant in any spelling (cu124, 12.4, 12.4.1); None when unknown."""
    v = parse_variant(spelling)
    return MIN_DRIVER.get(v.kind, {}).get(v.version) if v else None


def page_table() -> dict:
    """What the page needs: {cuda: driver}, the per-major floors and the note."""
    return {"min": dict(MIN_DRIVER_LINUX), "floor": dict(MINOR_COMPAT_FLOOR), "note": FORWARD_COMPAT_NOTE}
