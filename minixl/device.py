"""Where models run: the device a run asks for, and mixed precision on it.

Hand-written shared machinery (not generated): the trainer, evaluation, sampling and the
benchmarks all choose their device and their precision here (`resolve_dtype`: fp32, or bf16
autocast where the device runs it fast), read a process's peak memory on the CPU, and know a
GPU's bf16 peak, which MFU (`minixl bench`, `minixl train`'s metrics.csv) divides by. A run launched by torchrun (one process per GPU)
reads its place from the environment torchrun sets: RANK, LOCAL_RANK and WORLD_SIZE.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import time
from pathlib import Path

import torch

__all__ = ["PEAKS", "peak_tflops", "resolve_device", "DTYPES", "resolve_dtype",
           "cpu_bf16_speedup", "autocast", "distributed_env", "training_device", "peak_rss_mb"]

DTYPES = ("fp32", "bf16", "auto")
# `auto` picks bf16 on a CPU whose bf16 matmuls the probe measures at least this many times
# as fast as its fp32 ones (a CPU with AMX or AVX512-BF16 runs them 2 to 3 times as fast; one
# that emulates bf16, slower than fp32)
BF16_MIN_SPEEDUP = 1.5
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86's, and Arm's (its "Features")


# bf16 dense tensor-core peaks (TFLOP/s) from the vendors' data sheets.
PEAKS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),
         ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("RTX 4090", 165.0)]


def peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU by its name, or None when we do not know it."""
    for key, tflops in PEAKS:
        if re.search(r"(^|\W)" + re.escape(key) + r"($|\W)", device_name, re.IGNORECASE):
            return tflops
    return None


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no CUDA GPU here; "
                         "use --device auto or --device cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}: expected auto, cpu or cuda[:N]") from err
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                         "GPU(s), numbered from 0")
    return device


def autocast(device: torch.device, dtype: str | None = None):
    """bf16 autocast on `device` where dtype is 'bf16', nothing where it is 'fp32'; None: bf16
    on CUDA and nothing on the CPU (what evaluation and sampling use). Resolve 'auto' first
    (`resolve_dtype`). Weights, optimiser state and checkpoints stay fp32 either way."""
    if dtype is None:
        dtype = "bf16" if device.type == "cuda" else "fp32"
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"autocast takes dtype 'fp32' or 'bf16' (resolve 'auto' first with "
                         f"resolve_dtype), got {dtype!r}")
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _cpuinfo(*fields: str) -> str | None:
    """The value of the first /proc/cpuinfo line (Linux) that starts with one of `fields`, or
    None where there is none or the file cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(fields):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags ("flags" on x86, "Features" on Arm), or None where they cannot
    be read (then the probe decides)."""
    flags = _cpuinfo("flags", "Features")
    return None if flags is None else set(flags.split())


def _cpu_name() -> str:
    """The CPU's model name, else what platform says."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _cache_path() -> Path | None:
    """Where the probe's answers are kept: $MINIXL_CACHE, else ~/.cache/minixl; None where
    there is no home to keep them in."""
    try:
        root = os.environ.get("MINIXL_CACHE") or Path.home() / ".cache" / "minixl"
    except RuntimeError:
        return None
    return Path(root) / "bf16_probe.json"


def _probe(threads: int) -> float:
    """fp32 time over bf16 time of the same matmul ([768, 128] x [128, 512], a transformer
    of width 128 at 768 bytes a step), the fastest of 5 interleaved rounds of 20 each."""
    a, b = torch.randn(768, 128), torch.randn(128, 512)
    pairs = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
    best = {k: float("inf") for k in pairs}
    for _ in range(5):
        for k, (x, y) in pairs.items():
            x @ y  # warm
            t0 = time.perf_counter()
            for _ in range(20):
                x @ y
            best[k] = min(best[k], time.perf_counter() - t0)
    return best["fp32"] / best["bf16"]


@functools.lru_cache(maxsize=None)
def cpu_bf16_speedup() -> float | None:
    """How many times as fast this CPU runs a bf16 matmul as an fp32 one, at this process's
    thread count: None where /proc/cpuinfo shows no bf16 instructions (avx512_bf16, amx_bf16;
    nothing is probed then), else measured once and cached for the machine in
    ~/.cache/minixl/bf16_probe.json (or $MINIXL_CACHE), keyed by the CPU, the threads, the
    kernels torch may use (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) and torch's version.
    Processes that start at once take turns (a lock), so one probe runs and the others read
    its answer, not timing the CPU while it is shared."""
    flags = _cpu_flags()
    if flags is not None and not flags & set(_BF16_FLAGS):
        return None
    threads = torch.get_num_threads()
    isa = ",".join(f"{v}={os.environ[v]}" for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                   if os.environ.get(v))
    key = f"{_cpu_name()}|threads={threads}|{isa}|torch={torch.__version__}"
    path = _cache_path()
    if path is None:
        return _probe(threads)
    with _locked(path.with_suffix(".lock")):
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = {}
        cached = cached if isinstance(cached, dict) else {}
        if isinstance(cached.get(key), (int, float)):
            return float(cached[key])
        speedup = _probe(threads)
        try:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**cached, key: round(speedup, 3)}, indent=1))
            os.replace(tmp, path)  # whole or not at all
        except OSError:
            pass  # a read-only home: measured again next time
    return speedup


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (flock) while the block runs; none where it cannot be
    taken (no fcntl, a read-only folder): then two processes may both probe."""
    fd = None
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def resolve_dtype(name: str, device: torch.device, *, kind=None) -> tuple[str, str]:
    """('fp32' or 'bf16', why) for --dtype `name` on `device`. 'auto': bf16 on a CUDA GPU that
    has it; on a CPU, bf16 only for a model kind measured to gain from it (`kind.cpu_bf16`;
    no kind given: fp32, so a library caller's CPU run stays as it was) and only where
    `cpu_bf16_speedup` measures the CPU's bf16 matmuls at least BF16_MIN_SPEEDUP times as
    fast as fp32: a CPU without fast bf16 is never slowed."""
    if name not in DTYPES:
        raise ValueError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}")
    if name != "auto":
        return name, "as asked"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "auto: this GPU runs bf16"
        return "fp32", "auto: this GPU has no bf16"
    if device.type != "cpu":
        return "fp32", f"auto: fp32 on {device.type}"
    if kind is None or not getattr(kind, "cpu_bf16", False):
        which = "" if kind is None else f" for --model {kind.name}"
        return "fp32", (f"auto: bf16 on a CPU is not measured{which} (--dtype bf16 tries it)")
    speedup = cpu_bf16_speedup()
    if speedup is None:
        return "fp32", ("auto: this CPU has no bf16 instructions (" + " or ".join(_BF16_FLAGS)
                        + ")")
    if speedup < BF16_MIN_SPEEDUP:
        return "fp32", (f"auto: this CPU's bf16 matmuls ran {speedup:.1f}x its fp32 ones, "
                        f"under {BF16_MIN_SPEEDUP}x")
    return "bf16", f"auto: this CPU's bf16 matmuls ran {speedup:.1f}x its fp32 ones"


def distributed_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) of this process as torchrun sets them; (0, 0, 1) when
    it was not launched by torchrun."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers (torchrun sets "
                         f"them): {err}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"need 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0, got RANK={rank}, "
                         f"WORLD_SIZE={world}, LOCAL_RANK={local}")
    return rank, local, world


def training_device(name: str = "auto") -> torch.device:
    """The device this process trains on: resolve_device(name), except that a process of a
    distributed run on CUDA takes the GPU of its local rank (cuda:LOCAL_RANK)."""
    device = resolve_device(name)
    _, local, world = distributed_env()
    if world > 1 and device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} has no GPU: this machine has "
                             f"{torch.cuda.device_count()}; start at most that many processes "
                             "per node (torchrun --nproc-per-node)")
        device = torch.device("cuda", local)
    return device


def peak_rss_mb(reset: bool = False) -> float | None:
    """This process's peak resident memory in MB (VmHWM, Linux), or None where /proc is
    missing. With reset=True the peak is first set back to the current size, so that a
    later reading minus this one is the growth of what ran in between.

    Not `resource.getrusage().ru_maxrss`: Linux carries that across fork and exec, so a fresh
    process started by one that had grown large starts at its parent's peak (and a
    measurement by difference in the child reads 0)."""
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # an old kernel or a locked-down /proc: the peak since the start
            pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def memory_capacity(device: torch.device) -> tuple[int | None, str]:
    """(bytes a run on `device` may use, where that number comes from): a GPU's total memory,
    or on the CPU the memory Linux says is available now (MemAvailable in /proc/meminfo). None
    where it cannot be read (then nothing is refused on its account)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"{props.name}'s memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "this machine's available memory"
    except OSError:
        pass
    return None, "unknown"
