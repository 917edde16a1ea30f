"""doctor checks what a row says the host must provide: /dev/shm, the NVIDIA driver for the
stack's CUDA, kernels for this GPU (the probe's gpu_arch), against facts of this host."""

import os

from envbuild.doctor import Options, check_host

VERDICT = {"versions": {"torch_cuda": "12.4"},
           "hardware": {"gpu_arch": {"supports": ["sm_80", "sm_90"], "lacking": {"sm_100": ["flash_attn"]}}}}


def by_name(results):
    return {r.name: r for r in results}


def test_shm_of_this_host_and_a_small_one(tmp_path):
    real = by_name(check_host({}, Options(gpus_smi=lambda: [])))
    st = os.statvfs("/dev/shm")
    assert real["env.shm"].status == ("pass" if st.f_frsize * st.f_blocks >= 1 << 30 else "fail")
    assert "env.driver" not in real and "env.gpu-arch" not in real  # no NVIDIA GPU: nothing to judge
    # a 64 MB tmpfs is what Docker gives by default: statvfs of a path says so
    small = by_name(check_host({}, Options(gpus_smi=lambda: []), shm_path=str(tmp_path / "missing")))
    assert small["env.shm"].status == "warn"


def test_driver_and_gpu_arch_against_the_host():
    h200_new = lambda: [{"name": "NVIDIA H200", "driver": "570.124.06", "sm": 90, "arch": "sm_90"}]  # noqa: E731
    r = by_name(check_host(VERDICT, Options(gpus_smi=h200_new)))
    assert r["env.driver"].status == "pass" and "550.54.14" in r["env.driver"].reason
    assert r["env.gpu-arch"].status == "pass"
    b200_old = lambda: [{"name": "NVIDIA B200", "driver": "535.54.03", "sm": 100, "arch": "sm_100"}]  # noqa: E731
    r = by_name(check_host(VERDICT, Options(gpus_smi=b200_old)))
    # 535 runs CUDA 12.x toolkits through minor-version compatibility (floor 525.60.13): a warning
    assert r["env.driver"].status == "warn" and "older than 550.54.14" in r["env.driver"].reason
    assert r["env.gpu-arch"].status == "fail" and "flash_attn" in r["env.gpu-arch"].reason
    ancient = lambda: [{"name": "NVIDIA A100", "driver": "470.82.01", "sm": 80, "arch": "sm_80"}]  # noqa: E731
    assert by_name(check_host(VERDICT, Options(gpus_smi=ancient)))["env.driver"].status == "fail"
