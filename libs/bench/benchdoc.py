"""docs/benchmarks.md is written by several benchmarks, each owning one section between its own markers, and each
saying which machine it ran on in the same words (`machine()`)."""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Replace the text between `begin` and `end` (the section includes both markers), or append the section;
    every other section stays byte for byte."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module knows of the processor."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    """Physical memory in GiB, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, OSError, ValueError):
        return None


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The one machine line every benchmark's report carries: CPU model, logical CPUs, memory, Python, OS."""
    memory = memory_gib()
    return (f"{cpu_model(cpuinfo)}, {os.cpu_count()} logical CPUs"
            + (f", {memory:.0f} GiB RAM" if memory is not None else "")
            + f", Python {platform.python_version()} ({platform.python_implementation()}), "
            f"{platform.system()} {platform.release()}")
