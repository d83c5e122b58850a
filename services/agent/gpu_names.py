"""GPU names as NVML reports them, made canonical (pure, no NVML needed): a PCI bus id in sysfs form, the
marketing name plus memory as a short model ("H100-80GB"), and clock-event ("throttle") reason bits as names."""

from __future__ import annotations

import re

# Clock event ("throttle") reason bits -> names. Values are NVML's, stable across versions.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
)


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """NVML bus id ("00000000:1B:00.0" or legacy "0000:1B:00.0") -> sysfs form "0000:1b:00.0"."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    text = bus_id.strip().rstrip("\x00").lower()
    m = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", text)
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(m.group(1) or "0", 16) & 0xFFFF
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


# (regex on the upper-cased marketing name, canonical family, memory SKUs in GB or None)
# Order matters: longer/more specific names first.
_FAMILIES: tuple[tuple[str, str, tuple[int, ...] | None], ...] = (
    (r"\bGB200\b", "GB200", (186, 192)),
    (r"\bGH200\b", "GH200", (96, 144)),
    (r"\bB200\b", "B200", (180, 192)),
    (r"\bB100\b", "B100", (192,)),
    (r"\bH200\b", "H200", (141,)),
    (r"\bH100\b", "H100", (80, 94, 96)),
    (r"\bH800\b", "H800", (80,)),
    (r"\bH20\b", "H20", (96, 141)),
    (r"\bA100\b", "A100", (40, 80)),
    (r"\bA800\b", "A800", (40, 80)),
    (r"\bL40S\b", "L40S", None),
    (r"\bL40\b", "L40", None),
    (r"\bL4\b", "L4", None),
    (r"\bA40\b", "A40", None),
    (r"\bA30\b", "A30", None),
    (r"\bA10G\b", "A10G", None),
    (r"\bA10\b", "A10", None),
    (r"\bA16\b", "A16", None),
    (r"\bA2\b", "A2", None),
    (r"\bT4\b", "T4", None),
    (r"\bV100S?\b", "V100", (16, 32)),
    (r"\bP100\b", "P100", (12, 16)),
)


def canonical_model(name: str, memory_total_mib: int | None = None) -> str:
    """Marketing name (+ memory) -> short canonical model.

    "NVIDIA H100 80GB HBM3" -> "H100-80GB", "NVIDIA A100-SXM4-40GB" -> "A100-40GB",
    "NVIDIA H200" (143771 MiB) -> "H200-141GB", "NVIDIA L40S" -> "L40S", "Tesla T4" -> "T4".
    Families sold with several memory sizes get a "-<N>GB" suffix, taken from the name when
    it carries one, otherwise snapped from the reported memory to the nearest known SKU.
    Unknown names fall back to a cleaned-up name (plus memory when known).
    """
    upper = name.upper().replace("_", " ")
    gib = memory_total_mib / 1024 if memory_total_mib else None
    name_gb = [int(x) for x in re.findall(r"(\d+)\s*GB", upper)]
    for pattern, family, skus in _FAMILIES:
        if not re.search(pattern, upper):
            continue
        if skus is None:
            return family
        if name_gb:
            return f"{family}-{name_gb[0]}GB"
        if gib is not None:
            snapped = min(skus, key=lambda s: abs(s - gib))
            return f"{family}-{snapped}GB"
        return family
    cleaned = re.sub(r"^(NVIDIA|TESLA|QUADRO)\s+", "", upper.strip())
    cleaned = re.sub(r"^(NVIDIA|TESLA|QUADRO)\s+", "", cleaned)
    cleaned = re.sub(r"[^A-Z0-9]+", "-", cleaned).strip("-") or "UNKNOWN"
    if gib is not None and not name_gb:
        cleaned = f"{cleaned}-{round(gib)}GB"
    return cleaned


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_REASON_BITS if mask & bit)
