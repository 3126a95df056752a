"""The strict CuPy stand-in in every Python process: a dry run of the device check on a machine without a GPU.

``benchmarks/device_check.sh --dry-run`` puts this folder first on
``PYTHONPATH`` with ``RNSTENSOR_CUPY_STANDIN=1``, so every Python process the
check starts (the kernel build, each pytest worker, the benchmarks, the model)
imports tests/cupy_standin.py as ``cupy`` before anything else, in strict mode
(CuPy's rules: no implicit host conversion, no host operands among device
ones), as the device machine's CuPy would behave. Without the variable this
file does nothing.
"""

import os
import sys

if os.environ.get("RNSTENSOR_CUPY_STANDIN") == "1" and "cupy" not in sys.modules:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: cupy_standin
    import cupy_standin

    cupy_standin.install_for_process()
