"""Cost of keeping Z on the manifold, as ratios to the GEMM floor measured in the same run."""
from __future__ import annotations

import ctypes


def pin_threads(n: int = 1) -> list[str]:
    """Pin torch and every loaded OpenBLAS (numpy's and scipy's) to n threads; what was pinned."""
    done = []
    try:
        import torch

        torch.set_num_threads(n)
        done.append("torch")
    except Exception:  # pragma: no cover - torch is a dependency
        pass
    import numpy  # noqa: F401  (load the BLAS libraries before looking for them)
    import scipy.linalg  # noqa: F401

    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        libs = []
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done.append(path.rsplit("/", 1)[-1])
                break
    return done
