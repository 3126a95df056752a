"""The fused kernel's parameter layout, read from the one header that defines it (``rns_chain_layout.cuh``).

``RC`` names the int32 slots of a program's header, ``RS`` those of one op
record (``RS['SIZE']`` slots each), ``KERNEL`` the kernel's fixed sizes
(``THREADS`` per block, ``TMAX`` / ``PRODUCT_TMAX`` terms of a sum). The
packer (:mod:`rnstensor.kernels.fused`) writes records through these names,
so the host and the device read one layout.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

__all__ = ["RC", "RS", "KERNEL", "LAYOUT_HEADER", "read_layout"]

#: the header chain.cu includes
LAYOUT_HEADER = "rns_chain_layout.cuh"

_DEFINE = re.compile(r"^#define\s+(\w+)\s+(\d+)\b", re.M)


@lru_cache(maxsize=None)
def read_layout(path: str | None = None) -> dict[str, int]:
    """Every ``#define NAME value`` (integer values) of the layout header."""
    text = Path(path or Path(__file__).with_name(LAYOUT_HEADER)).read_text()
    return {name: int(value) for name, value in _DEFINE.findall(text)}


def _group(prefix: str) -> MappingProxyType:
    return MappingProxyType({k[len(prefix):]: v for k, v in read_layout().items() if k.startswith(prefix)})


#: program header slots (``RC_*``)
RC = _group("RC_")
#: op record slots (``RS_*``; ``RS['SIZE']`` per record)
RS = _group("RS_")
#: fixed sizes of the kernel (``RNS_CHAIN_THREADS`` as ``THREADS``, ``RNS_TMAX``, ``RNS_PRODUCT_TMAX``)
KERNEL = MappingProxyType({"THREADS": read_layout()["RNS_CHAIN_THREADS"], "TMAX": read_layout()["RNS_TMAX"],
                           "PRODUCT_TMAX": read_layout()["RNS_PRODUCT_TMAX"]})
