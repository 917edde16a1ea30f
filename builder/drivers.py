"""The oldest driver that runs each accelerator toolkit, asked through the kind's descriptor
(hardware.AcceleratorKind: min_driver, driver_floor, driver_note, driver_label), so a kind with a
table is answered here, by doctor, the table's rows and the page alike.
"""

from __future__ import annotations

from .probe.hardware import CUDA_KIND, parse_variant


def min_driver(spelling: object) -> str | None:
    """The oldest driver for a variant in any spelling (cu124, 12.4, 12.4.1); None when unknown."""
    v = parse_variant(spelling)
    return v.accelerator.min_driver.get(v.version) if v else None


def driver_floor(spelling: object) -> str | None:
    """The oldest driver of the variant's major that runs it through minor version compatibility."""
    v = parse_variant(spelling)
    return v.accelerator.driver_floor.get(v.version.split(".")[0]) if v else None


def driver_label(spelling: object) -> str:
    """What a reader calls the variant's driver (`NVIDIA driver`); "driver" when unknown."""
    v = parse_variant(spelling)
    return (v.accelerator.driver_label if v else "") or "driver"


def page_table() -> dict:
    """What the page's driver filter needs: {toolkit: driver}, the per-major floors, the note and
    the label. The filter speaks of NVIDIA drivers only: the CUDA kind's table."""
    k = CUDA_KIND
    return {"min": dict(k.min_driver), "floor": dict(k.driver_floor), "note": k.driver_note, "label": k.driver_label}
