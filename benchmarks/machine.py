"""What every benchmark prints about the machine: the CPU model and its AVX-512 flags, the load average, and the GEMM
floor (a 2048³ float32 product on torch's kernel), so each row can be read against the fastest dense product this
machine offers through torch."""

from __future__ import annotations

import os
import platform
import statistics
import time

import torch


def cpu() -> dict:
    """CPU model name and its avx512* flags (from /proc/cpuinfo where there is one)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = sorted(f for f in value.split() if f.startswith("avx512"))
                    break
    except OSError:
        pass
    return {"model": model, "avx512": flags, "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(), "platform": platform.platform()}


def gemm_floor(repeats: int = 5, n: int = 2048) -> dict:
    """GFLOP/s of an n³ float32 product on torch's kernel: `{"wall": {"plain": rate}, "cpu": {"plain": rate}}`, from
    the median wall time and the median CPU time (`time.process_time`) of `repeats` runs."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    times = []
    for i in range(repeats + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        torch.mm(x, y)
        if i:
            times.append((time.perf_counter() - w0, time.process_time() - c0))
    rate = lambda j: 2 * n**3 / statistics.median(t[j] for t in times) / 1e9
    return {"wall": {"plain": rate(0)}, "cpu": {"plain": rate(1)}}


def best_floor(*floors: dict) -> dict:
    """The best rate of each kind and clock over several `gemm_floor` results (before and after a run)."""
    return {clock: {k: max(f[clock][k] for f in floors) for k in floors[0][clock]} for clock in ("wall", "cpu")}


def header(info: dict, floor: dict, load: tuple) -> str:
    """One line naming the machine, the load and the floors (a `best_floor` result)."""
    fl = "; ".join(f"{k} {floor['wall'][k]:.0f} wall, {floor['cpu'][k]:.0f} CPU" for k in floor["wall"])
    return (f"CPU {info['model']} ({info['cpu_count']} CPUs; {' '.join(info['avx512']) or 'no AVX-512'}), torch "
            f"{info['torch']}, {info['torch_threads']} threads; 1-min load "
            f"average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after (shared machine); GEMM floor 2048³ "
            f"float32 GFLOP/s (median; by wall and by CPU time): {fl}")
