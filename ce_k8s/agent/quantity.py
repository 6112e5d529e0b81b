"""Kubernetes resource quantities (`500m`, `2`, `1Gi`, `1.5e3`) as plain numbers, for accounting.

Why here and not the emulator's parser: the agent room may not import `ce_k8s.sim`, and accounting
only needs a float (cores, bytes), not the exact arithmetic the scheduler emulation keeps.
The suffixes are those of apimachinery's resource.Quantity (binary Ki..Ei, decimal n..E).
"""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def quantity(text: object) -> float | None:
    """The number a quantity stands for, or None when it is not one."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    m = _QUANTITY.match(str(text or "").strip())
    if not m:
        return None
    number = float(m[1])
    if m[2]:
        return number * 10.0 ** int(m[2][1:])
    return number * _SUFFIX[m[3] or ""]
