"""Hardware axes: accelerator kinds and their variants (cu126, rocm6.2, cpu), and platforms.

Part of the probe's vocabulary (envbuild_probe.vocab has the levels, statuses and engines): standard
library only, because the probe runs inside images where envbuild is not installed. Every table,
flag and check about an accelerator variant or a platform derives from these descriptors: adding
an accelerator kind is one AcceleratorKind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ---------------------------------------------------------------- accelerator variants


@dataclass(frozen=True)
class AcceleratorKind:
    """One kind of accelerator a torch build targets.

    prefix          the variant tag's prefix (`cu` + 124, `rocm` + 6.2); the tag is also the PyTorch
                    index's folder for the variant (download.pytorch.org/whl/<tag>)
    torch_attr      what torch reports it under (torch.version.cuda / torch.version.hip)
    container_args  how a container gets the devices (`docker run` arguments)
    device_nodes    device files whose presence means this host has one
    smi             the command that lists the devices ([] when none)
    no_device       (pattern, why): what its stack prints on a host without its devices or driver;
                    the probe classifies those as needs-gpu (not judged here), never as broken
    driver_lib      the driver's user-space library: "<it>: cannot open shared object file" means
                    this host has no driver
    driver_label    what a reader calls that driver
    env_checks      the env level's checks of a torch built for it (its GPU libraries, and which GPUs
                    its extensions have kernels for); a kind without them is said not checked
    min_driver      toolkit version ("12.4") -> the oldest Linux driver that runs it
    driver_floor    major ("12") -> the oldest driver that runs any toolkit of that major (minor
                    version compatibility), and driver_note: what else bridges a newer toolkit
    gpus            product name -> architecture number (H100 -> 90), spelled arch_prefix + number
                    (sm_90): what `pick --gpu`, doctor and the page call a GPU
    gpu_query       a command printing one `name, driver, architecture` CSV line per GPU here
    """

    name: str
    label: str
    prefix: str
    torch_attr: str | None
    container_args: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()
    smi: tuple[str, ...] = ()
    no_device: tuple[tuple[str, str], ...] = ()
    driver_lib: str | None = None
    driver_label: str = ""
    env_checks: tuple[str, ...] = ()
    min_driver: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    driver_floor: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    driver_note: str = ""
    gpus: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    arch_prefix: str = ""
    arch_aliases: tuple[str, ...] = ()  # other prefixes a user or a tool writes (`sm90`, `compute_90`)
    arch_suffixes: tuple[str, ...] = ()  # target variants of one architecture (sm_90a, sm_100f)
    arch_range: tuple[int, int] = (0, 0)  # a bare number in it is one of this kind's architectures
    gpu_query: tuple[str, ...] = ()

    def arch_name(self, number: int) -> str:
        return f"{self.arch_prefix}{number}"

    def arch_number(self, text: object) -> int | None:
        """An architecture in this kind's spellings (`sm_90`, `sm90a`, `9.0` as its GPU listing prints
        it, `90`) -> 90; None if it is not one of them."""
        s = str(text or "").strip().lower()
        prefixed = False
        for p in sorted((self.arch_prefix, *self.arch_aliases), key=len, reverse=True):
            if p and s.startswith(p):
                s, prefixed = s[len(p):], True
                break
        if prefixed:
            for suffix in self.arch_suffixes:
                s = s.removesuffix(suffix)
        if "." in s:
            a, _, b = s.partition(".")
            n = int(a) * 10 + int(b) if a.isdigit() and b.isdigit() and len(b) == 1 else None
        else:
            n = int(s) if s.isdigit() else None
        return n if n is not None and (prefixed or self.arch_range[0] <= n <= self.arch_range[1]) else None


# NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions" (Linux
# x86_64, the toolkit's GA release). Within one CUDA major, minor version compatibility lets an older
# driver of that major (from the floor) run newer minor toolkits, minus features that need the newer
# driver (PTX JIT of newer PTX); data-center GPUs can also use the forward-compatibility package.
_CUDA_DRIVERS = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06",
    "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06",
}
_CUDA_FLOORS = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}
_CUDA_NOTE = ("An older driver of the same CUDA major version (at least {floor}) runs this "
              "toolkit through minor version compatibility, minus features that need the newer "
              "driver; data-center GPUs can use the forward-compatibility package (cuda-compat) "
              "for a newer toolkit on an older driver.")
# GPU product names -> compute capability (major*10+minor). Grace-Hopper/Blackwell superchips carry
# the same GPU as their discrete parts.
_CUDA_GPUS = {
    "V100": 70, "T4": 75, "A100": 80, "A30": 80, "A10": 86, "A10G": 86, "A40": 86, "RTX3090": 86,
    "L4": 89, "L40": 89, "L40S": 89, "RTX4090": 89, "H100": 90, "H200": 90, "H20": 90, "GH200": 90,
    "B200": 100, "GB200": 100, "B300": 103, "GB300": 103, "RTX5090": 120, "RTXPRO6000": 120,
}


CUDA_KIND = AcceleratorKind("cuda", "CUDA", "cu", "cuda", ("--gpus", "all"), ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"),
                            ("nvidia-smi", "-L"),
                            no_device=((r"Found no NVIDIA driver", "no NVIDIA driver"),
                                       (r"No CUDA GPUs are available", "no CUDA GPU available"),
                                       (r"CUDA driver initialization failed", "CUDA driver initialization failed"),
                                       (r"Torch not compiled with CUDA enabled", "torch has no CUDA (CPU build)"),
                                       (r"NVML Shared Library Not Found|libnvidia-ml\.so(?:\.1)?: cannot open",
                                        "NVML (driver) not found"),
                                       (r"cudaGetDeviceCount|CUDA_ERROR_NO_DEVICE|no CUDA-capable device is detected",
                                        "no CUDA device")),
                            driver_lib="libcuda", driver_label="NVIDIA driver",
                            env_checks=("cudnn", "nccl", "gpu-arch"),
                            min_driver=_CUDA_DRIVERS, driver_floor=_CUDA_FLOORS, driver_note=_CUDA_NOTE,
                            gpus=_CUDA_GPUS, arch_prefix="sm_", arch_aliases=("sm", "compute_"),
                            arch_suffixes=("a", "f"), arch_range=(10, 200),
                            gpu_query=("nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                       "--format=csv,noheader"))
ROCM_KIND = AcceleratorKind("rocm", "ROCm", "rocm", "hip",
                            ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"),
                            ("/dev/kfd",), ("rocm-smi", "--showproductname"),
                            no_device=((r"No HIP GPUs are available", "no ROCm GPU available"),
                                       (r"hipErrorNoDevice|no ROCm-capable device is detected", "no ROCm device"),
                                       (r"HIP driver initialization failed|hipErrorNoBinaryForGpu.*no GPU",
                                        "HIP driver initialization failed")),
                            driver_label="AMD GPU driver (amdgpu)")  # user space comes in the torch wheel
CPU_KIND = AcceleratorKind("cpu", "CPU", "cpu", None)
ACCELERATORS = {k.name: k for k in (CUDA_KIND, ROCM_KIND, CPU_KIND)}
KIND_OF_TORCH_ATTR = {k.torch_attr: k.name for k in ACCELERATORS.values() if k.torch_attr}  # "hip" -> "rocm"


def gpu_names() -> dict[str, str]:
    """Every GPU product name any kind knows -> its architecture's spelling (`H100` -> `sm_90`)."""
    return {n: k.arch_name(cc) for k in ACCELERATORS.values() for n, cc in k.gpus.items()}


def arch_key(spelling: str) -> tuple:
    """The order of architecture spellings on the page: by kind, then number (sm_90 < sm_100)."""
    for i, k in enumerate(ACCELERATORS.values()):
        if k.arch_prefix and spelling.startswith(k.arch_prefix) and k.arch_number(spelling) is not None:
            return (i, k.arch_number(spelling), spelling)
    return (len(ACCELERATORS), 0, spelling)


def parse_gpu(value: object) -> str | None:
    """What a user calls a GPU -> its architecture as the table spells it: a product name any kind
    knows (`H100`, `b300`, `NVIDIA H200`) or an architecture in a kind's spellings (`sm_90`,
    `9.0`, `90`) -> `sm_90`; None if no kind reads it."""
    s = str(value if value is not None else "").strip()
    key = s.upper().replace(" ", "").replace("-", "").removeprefix("NVIDIA").removeprefix("AMD")
    for name, arch in gpu_names().items():
        if name.upper() == key:
            return arch
    for k in ACCELERATORS.values():
        n = k.arch_number(s) if k.arch_prefix else None
        if n is not None:
            return k.arch_name(n)
    return None
CPU = "cpu"  # the variant tag of a CPU-only torch build


@dataclass(frozen=True)
class Variant:
    """An accelerator variant: a kind and its version (`cu124` = CUDA 12.4, `rocm6.2`, `cpu`)."""

    kind: str
    version: str = ""  # "12.4"; "" for cpu

    @property
    def accelerator(self) -> AcceleratorKind:
        return ACCELERATORS[self.kind]

    @property
    def tag(self) -> str:
        """`cu124`, `rocm6.2`, `cpu`: the axis value, the image tag's part, the PyTorch index folder."""
        if self.kind == "cuda":
            major, minor = self.version.split(".")[:2]
            return f"cu{major}{minor}"
        return f"{self.accelerator.prefix}{self.version}"

    @property
    def index_path(self) -> str:
        return self.tag

    @property
    def env_suffix(self) -> str:
        """The tag as a shell identifier's tail (per-variant secrets: `rocm6.2` -> `rocm6_2`)."""
        return re.sub(r"[^A-Za-z0-9_]", "_", self.tag)

    @property
    def label(self) -> str:
        return f"{self.accelerator.label} {self.version}".strip()

    def __str__(self) -> str:
        return self.tag


_VARIANT_RES = (
    ("cuda", re.compile(r"(?:cuda\s*)?cu(\d{1,2})(\d)", re.I)),
    ("cuda", re.compile(r"(?:cuda\s*)?(\d{1,2})\.(\d)(?:\.\d+)*", re.I)),
    ("rocm", re.compile(r"rocm\s*(\d{1,2})\.(\d{1,2})(?:\.\d+)*", re.I)),
)


def parse_variant(value: object) -> Variant | None:
    """Any spelling -> the variant: `cu126`, `12.6`, `12.6.3`, `CUDA 12.6` -> cu126; `rocm6.2`,
    `ROCm 6.2.4` -> rocm6.2; `cpu` -> cpu; None for anything else."""
    s = str(value if value is not None else "").strip()
    if s.lower() in (CPU, "none"):
        return Variant("cpu")
    for kind, rx in _VARIANT_RES:
        m = rx.fullmatch(s)
        if m:
            return Variant(kind, f"{int(m.group(1))}.{int(m.group(2))}")
    return None


def env_suffix(value: object) -> str:
    """Any spelling of a variant -> its shell-identifier tail (Variant.env_suffix); the value itself,
    made safe the same way, when it is no variant."""
    v = parse_variant(value)
    return v.env_suffix if v else re.sub(r"[^A-Za-z0-9_]", "_", str(value))


def variant_tag(value: object) -> str | None:
    """Any spelling -> the tag (`12.4` -> `cu124`), None if not a variant."""
    v = parse_variant(value)
    return v.tag if v else None


def torch_build_kind(version_py: str) -> str | None:
    """The accelerator kind a torch build targets, read from the text of its `torch/version.py`
    (`cuda: Optional[str] = '13.0'`, `hip: Optional[str] = None`) without importing torch: the
    kind whose `torch_attr` holds a version, `cpu` when none does, None when unreadable."""
    import ast

    try:
        tree = ast.parse(version_py)
    except (SyntaxError, ValueError):
        return None
    seen = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id in KIND_OF_TORCH_ATTR and isinstance(node.value, ast.Constant):
            seen.add(target.id)
            if isinstance(node.value.value, str) and node.value.value:
                return KIND_OF_TORCH_ATTR[target.id]
    return CPU if seen else None


def variant_of(kind: str, version: object) -> Variant:
    """The variant torch reports: kind `cuda` with torch.version.cuda `12.4`, `rocm` with
    torch.version.hip `6.2.41133`; kind cpu (or no version) -> cpu."""
    parts = re.findall(r"\d+", str(version or ""))
    if kind == "cpu" or len(parts) < 2:
        return Variant("cpu")
    return Variant(kind, f"{int(parts[0])}.{int(parts[1])}")


# ---------------------------------------------------------------- platforms


@dataclass(frozen=True)
class PlatformSpec:
    """A platform: Docker's name, the machine Python and wheel tags say, Debian's architecture."""

    name: str
    machine: str
    arch: str


PLATFORM_SPECS = (PlatformSpec("linux/amd64", "x86_64", "amd64"), PlatformSpec("linux/arm64", "aarch64", "arm64"))
PLATFORMS = {p.name: p for p in PLATFORM_SPECS}
DEFAULT_PLATFORM = "linux/amd64"  # its combinations' ids and tags carry no platform (as before the axis)


def parse_platform(value: object) -> str | None:
    """Any spelling (`linux/arm64`, `linux/arm64/v8`, `arm64`, `aarch64`) -> `linux/arm64`; None if unknown."""
    s = str(value if value is not None else "").strip().lower()
    if s.endswith("/v8"):
        s = s[:-3]
    s = s.removeprefix("linux/")
    for p in PLATFORM_SPECS:
        if s in (p.machine, p.arch):
            return p.name
    return None


def platform_spec(platform: str) -> PlatformSpec:
    return PLATFORMS[parse_platform(platform) or platform]


def platform_machine(platform: str) -> str:
    """`linux/arm64` -> `aarch64` (platform.machine() inside the image; the wheel tag's arch)."""
    return platform_spec(platform).machine


def platform_arch(platform: str) -> str:
    """`linux/arm64` -> `arm64` (Debian's and Docker's architecture name)."""
    return platform_spec(platform).arch


def host_platform() -> str | None:
    """This machine's platform, None for one envbuild has no images for."""
    import platform as _platform

    return parse_platform(_platform.machine())
