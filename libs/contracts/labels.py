"""Node labels and the selectors that match them, spelled as Kubernetes spells labels.

A key is an optional prefix (a DNS subdomain, at most 253 characters) and '/', then a name of at most 63
characters: alphanumerics, '-', '_' and '.', beginning and ending with an alphanumeric (`zone`,
`example.com/disk`, `gpupool.io/isolation.sandbox`). A value is empty or a name of the same form.
"""

from __future__ import annotations

import re

MAX_SELECTOR = 16  # labels one job may ask for
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_problem(key: str, value: str) -> str | None:
    """What is wrong with one label (None: nothing)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return f"label key {key!r}: its prefix must be a DNS subdomain (lowercase, at most 253 characters)"
    if not _NAME.match(name):
        return (f"label key {key!r}: its name must be 1-63 characters of letters, digits, '-', '_' or '.', "
                f"beginning and ending with a letter or digit")
    if value and not _NAME.match(value):
        return (f"label {key}={value!r}: a value is empty or 1-63 characters of letters, digits, '-', '_' or '.', "
                f"beginning and ending with a letter or digit")
    return None


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """`labels` as they are, or ValueError naming the first bad one (a pydantic AfterValidator)."""
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem is not None:
            raise ValueError(problem)
    return labels


def parse_labels(text: str) -> dict[str, str]:
    """'zone=a,disk=nvme' → {'zone': 'a', 'disk': 'nvme'} (checked; ValueError on a bad entry)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"bad label {part!r}; expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return check_labels(out)
