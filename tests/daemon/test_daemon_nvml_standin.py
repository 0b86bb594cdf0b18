"""NvmlSource through the REAL pynvml, its library handle pointed at a STAND-IN libnvidia-ml
built here (tests/support/nvml_standin.c: nvml.h's signatures, struct layouts and return codes;
no GPU on this machine). FakeNvml (test_daemon_cards_nvml.py) replaces pynvml's functions;
this checks what it cannot: the names and arguments of the pynvml calls, the ctypes structs
the C functions fill, and the direct memory read on a real C function pointer."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pynvml
import pytest

from rankscope.daemon.devices import CardIdentity, DeviceError, NvmlSource
from rankscope.daemon.sampler import Sampler

GiB = 1 << 30
NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
SOURCE = Path(__file__).resolve().parents[1] / "support" / "nvml_standin.c"


@pytest.fixture(scope="module")
def standin_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the NVML stand-in")
    built = tmp_path_factory.mktemp("nvml") / "libnvidia-ml-standin.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(built), str(SOURCE)], check=True)
    return built


@pytest.fixture
def lib(standin_library: Path, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    """The stand-in, as pynvml's loaded library (its function cache and error texts fresh), with
    two cards: an H200 and a compute-only H100 whose graphics process list is unsupported."""
    standin = ctypes.CDLL(str(standin_library))
    text, u64 = ctypes.c_char_p, ctypes.c_ulonglong
    standin.standin_set_card.argtypes = [ctypes.c_int, text, text, u64, u64]
    standin.standin_add_process.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint, u64]
    standin.standin_reset(2)
    standin.standin_set_card(0, b"GPU-0a1b2c3d-standin", b"NVIDIA H200", 141 * GiB, 100 * GiB)
    standin.standin_set_card(1, b"GPU-4e5f6a7b-standin", b"NVIDIA H100 80GB HBM3", 80 * GiB, 9)
    standin.standin_set_graphics_unsupported(1)
    monkeypatch.setattr(pynvml, "nvmlLib", standin)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml.NVMLError, "_errcode_to_string", {})
    return standin


def test_cards_open_with_their_identity_and_free_reads_call_nvml_directly(
    lib: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = NvmlSource()
    assert src.open() == [
        CardIdentity(0, 0, "GPU-0a1b2c3d-standin", "NVIDIA H200", 141 * GiB),
        CardIdentity(1, 1, "GPU-4e5f6a7b-standin", "NVIDIA H100 80GB HBM3", 80 * GiB),
    ]
    assert src.incomplete is None
    # The sampler's read is one call of the C function, never pynvml's wrapper.
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", None)
    calls = lib.standin_meminfo_calls()
    assert (src.read_free(0), src.read_free(1)) == (100 * GiB, 9)
    assert lib.standin_meminfo_calls() == calls + 2
    src.close()


def test_process_lists_of_both_kinds_a_missing_figure_and_a_lost_card(lib: ctypes.CDLL) -> None:
    lib.standin_add_process(0, 0, 4242, 3 * GiB)
    lib.standin_add_process(0, 0, 4343, NOT_AVAILABLE)
    lib.standin_add_process(0, 1, 4242, 3 * GiB)  # a compute and a graphics context: once
    lib.standin_add_process(0, 1, 4444, GiB)
    lib.standin_add_process(1, 0, 5151, 7 * GiB)
    src = NvmlSource()
    src.open()
    assert src.read_processes(0) == {4242: 3 * GiB, 4343: None, 4444: GiB}
    assert src.read_processes(1) == {5151: 7 * GiB}  # graphics: Not Supported, skipped
    lib.standin_set_lost(1, 1)
    with pytest.raises(DeviceError, match="compute processes of card slot 1: GPU is lost"):
        src.read_processes(1)
    with pytest.raises(DeviceError, match="memory info of card slot 1: GPU is lost"):
        src.read_free(1)
    src.close()


def test_the_sampler_serves_the_other_card_while_one_is_lost_and_reopens_nvml(
    lib: ctypes.CDLL,
) -> None:
    s = Sampler(NvmlSource(), interval=0.1)
    s.sample(0.0)
    lib.standin_set_lost(0, 1)
    t = 0.0
    while t < 5:
        t += 0.1
        s.sample(t)
    lost, other = s.views(t)
    assert (lost.up, lost.free, other.up, other.free) == (False, None, True, 9)
    assert s.source_failing == "NVML could not open card 0: GPU is lost"
    lib.standin_set_lost(0, 0)
    s.sample(t + 60)
    assert [v.free for v in s.views(t + 60)] == [100 * GiB, 9] and s.up()
    s.stop()
    assert lib.standin_initialised() == 0, "each NVML init of a reopen was shut down"
