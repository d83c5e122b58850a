"""A job's spec from a YAML file (-f job.yaml) and flags: the fields it may have, what each accepts (cores, MiB or
GiB, a GPU fraction, a node selector, a duration), and the merged request `gpupool submit` and `run` send."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from libs.cli.common import UsageError, parse_duration

SPEC_KEYS = {"name": "name", "team": "team", "project": "project", "gpus": "gpus", "kind": "kind",
             "priority_class": "priority_class", "priority-class": "priority_class",
             "gpu_models": "gpu_models", "gpu-models": "gpu_models", "models": "gpu_models", "model": "gpu_models",
             "idempotency_key": "idempotency_key", "idempotency-key": "idempotency_key",
             "gang_nodes": "gang_nodes", "gang-nodes": "gang_nodes",
             "gpus_per_node": "gpus_per_node", "gpus-per-node": "gpus_per_node", "replicas": "replicas",
             "max_runtime_s": "max_runtime_s", "max_runtime": "max_runtime_s", "max-runtime": "max_runtime_s",
             "gpu_fraction_milli": "gpu_fraction_milli", "fraction": "gpu_fraction_milli",
             "gpu_memory_mib": "gpu_memory_mib", "gpu-memory": "gpu_memory_mib", "mig_profile": "mig_profile",
             "mig": "mig_profile", "exclusive": "exclusive", "min_replicas": "min_replicas",
             "min-replicas": "min_replicas", "max_replicas": "max_replicas", "max-replicas": "max_replicas",
             "autoscale": "autoscale", "cpu": "cpu", "cpu_milli": "cpu_milli", "memory": "memory_mib",
             "memory_mib": "memory_mib", "node_selector": "node_selector", "node-selector": "node_selector",
             "selector": "node_selector", "preemptible": "preemptible"}
SPEC_FIELDS = ("name, team, project, gpus, gpu_models, kind, priority_class, gang_nodes, gpus_per_node, replicas, "
               "max_runtime_s, gpu_fraction_milli, gpu_memory_mib, mig_profile, exclusive, idempotency_key, "
               "min_replicas, max_replicas, autoscale, cpu (cores) or cpu_milli, memory_mib (or memory), "
               "node_selector, preemptible; the work: command, env, workdir, limits, stop_signal, "
               "stop_grace_s, warn_before_s, warn_signal, restart, isolation, image, rootfs, ports, health")


def load_spec_file(path: str) -> dict[str, Any]:
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{path} is not valid YAML{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"{path} must be a YAML mapping of job fields (name, team, gpus, ...)")
    return doc


def merge_spec(file_doc: dict[str, Any] | None, flags: dict[str, Any]) -> dict[str, Any]:
    """The job to submit: the file's fields, then every flag that was given on top. Unknown keys, wrong types and
    missing required fields are usage errors."""
    spec: dict[str, Any] = {}
    for key, value in (file_doc or {}).items():
        target = SPEC_KEYS.get(str(key))
        if target is None:
            raise UsageError(f"unknown job field {key!r} (allowed: {SPEC_FIELDS})")
        spec[target] = value
    for key, value in flags.items():
        if value is not None and value != []:
            spec[key] = value
    if "gpu_models" in spec:
        models = spec["gpu_models"]
        if isinstance(models, str):
            models = [m.strip() for m in models.split(",") if m.strip()]
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise UsageError("gpu_models must be a model name or a list of model names")
        spec["gpu_models"] = models
    if "gpu_fraction_milli" in spec and isinstance(spec["gpu_fraction_milli"], float | str) \
            and not str(spec["gpu_fraction_milli"]).strip().isdigit():
        spec["gpu_fraction_milli"] = parse_fraction(spec["gpu_fraction_milli"])
    if "gpu_memory_mib" in spec:
        spec["gpu_memory_mib"] = parse_mib(spec["gpu_memory_mib"])
    if (spec.get("gpu_fraction_milli") or spec.get("mig_profile")) and "gpus" not in spec:
        spec["gpus"] = 1  # a share is of one GPU
    if "exclusive" in spec and not isinstance(spec["exclusive"], bool):
        raise UsageError("exclusive must be true or false")
    host_fields(spec)
    for key in ("gpus", "gang_nodes", "gpus_per_node", "replicas", "gpu_fraction_milli"):
        if key in spec:
            spec[key] = _whole(key, spec[key])
    if "max_runtime_s" in spec:
        spec["max_runtime_s"] = parse_duration(spec["max_runtime_s"])
        if spec["max_runtime_s"] <= 0:
            raise UsageError("max runtime must be positive")
    for key in ("name", "team", "project", "kind", "priority_class", "idempotency_key"):
        if key in spec and not isinstance(spec[key], str):
            spec[key] = str(spec[key])
    if spec.get("gang_nodes"):
        if not spec.get("gpus_per_node"):
            raise UsageError("a gang needs --gpus-per-node as well as --gang-nodes")
        if spec.get("replicas", 1) != 1:
            raise UsageError("a gang cannot also have replicas")
        product = spec["gang_nodes"] * spec["gpus_per_node"]
        if spec.setdefault("gpus", product) != product:  # --gpus may be left out of a gang: it is the product
            raise UsageError(f"a gang's gpus ({spec['gpus']}) must equal gang_nodes × gpus_per_node ({product})")
    elif spec.get("gpus_per_node"):
        raise UsageError("--gpus-per-node needs --gang-nodes")
    missing = [k for k in ("name", "team", "gpus") if k not in spec]
    if missing:
        raise UsageError("missing " + ", ".join(f"--{m}" for m in missing) + " (as flags or in the -f file)")
    return spec


def host_fields(spec: dict[str, Any]) -> None:
    """The job's host CPU (`cpu` in cores → cpu_milli), memory (MiB or with a unit), node selector (a mapping,
    or KEY=VALUE strings) and preemptible flag, in the body's terms (in place)."""
    if "cpu" in spec:
        spec["cpu_milli"] = parse_cpu(spec.pop("cpu"))
    if "cpu_milli" in spec:
        spec["cpu_milli"] = _whole("cpu_milli", spec["cpu_milli"])
    if "memory_mib" in spec:
        spec["memory_mib"] = parse_mib(spec["memory_mib"])
    if "node_selector" in spec:
        spec["node_selector"] = parse_selector(spec["node_selector"])
    if "preemptible" in spec and not isinstance(spec["preemptible"], bool):
        raise UsageError("preemptible must be true or false")


def parse_cpu(value: Any) -> int:
    """Host CPU in cores ('4', '0.5', '500m' as Kubernetes writes milli-cores) → milli-cores."""
    text = str(value).strip().lower()
    try:
        milli = int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
    except ValueError:
        raise UsageError(f"cpu must be cores like 4 or 0.5 (or milli-cores like 500m), not {value!r}") from None
    if milli <= 0:
        raise UsageError(f"cpu must be more than 0, not {value!r}")
    return milli


def parse_selector(value: Any) -> dict[str, str]:
    """A node selector: a mapping (YAML), or KEY=VALUE strings (repeated --selector flags)."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise UsageError("node_selector must be a mapping of label: value")
    out: dict[str, str] = {}
    for item in items:
        key, eq, val = str(item).partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--selector expects KEY=VALUE, not {item!r}")
        out[key.strip()] = val.strip()
    return out


def parse_fraction(value: Any) -> int:
    """A share of one GPU: '0.25', '25%' or milli-GPU ('250') → 250."""
    text = str(value).strip()
    try:
        if text.endswith("%"):
            milli = round(float(text[:-1]) * 10)
        elif "." in text:
            milli = round(float(text) * 1000)
        else:
            milli = int(text)
    except ValueError:
        raise UsageError(f"fraction must be like 0.25, 25% or 250 (milli-GPU), not {value!r}") from None
    if not 0 < milli < 1000:
        raise UsageError(f"a fraction is more than 0 and less than one GPU, not {value!r}")
    return milli


def parse_mib(value: Any) -> int:
    """GPU memory: MiB as a number, or with a unit ('12GiB', '512MiB', '16G')."""
    text = str(value).strip()
    units = {"gib": 1024, "gb": 1024, "g": 1024, "mib": 1, "mb": 1, "m": 1}
    lowered = text.lower()
    for unit, factor in units.items():
        if lowered.endswith(unit) and lowered[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return round(float(lowered[: -len(unit)]) * factor)
    if text.isdigit():
        return int(text)
    raise UsageError(f"GPU memory must be MiB or e.g. 12GiB, not {value!r}")


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise UsageError(f"{key} must be a whole number, not {value!r}")
    return int(value)
