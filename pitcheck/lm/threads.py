"""One BLAS thread for numpy and scipy while an lm run interleaves torch work with numpy's.

Measured here (2 cores): a 1024 x 32 numpy QR right after a torch matmul takes ~70 ms with OpenBLAS's
default two threads and ~1.5 ms with one: its idle threads and torch's contend for the cores. The run
already gives torch one thread; this does the same for the OpenBLAS builds numpy and scipy carry, through
their own set_num_threads, and puts the previous counts back. Where none is found it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")


def _libraries() -> list[tuple]:
    """(set, get) function pairs of every OpenBLAS that numpy and scipy load."""
    import numpy
    import scipy

    found = []
    for package in (numpy, scipy):
        libs = os.path.join(os.path.dirname(os.path.dirname(package.__file__)), f"{package.__name__}.libs")
        for path in sorted(glob.glob(os.path.join(libs, "*openblas*.so*"))):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for name in _SETTERS:
                setter = getattr(lib, name, None)
                getter = getattr(lib, name.replace("set_", "get_"), None)
                if setter is not None and getter is not None:
                    getter.restype = ctypes.c_int
                    found.append((setter, getter))
                    break
    return found


@contextlib.contextmanager
def single_blas_thread():
    pairs = []
    try:
        pairs = [(s, g, g()) for s, g in _libraries()]
    except Exception:  # a build without these symbols: leave its threads as they are
        pairs = []
    for setter, _, _ in pairs:
        setter(1)
    try:
        yield
    finally:
        for setter, _, previous in pairs:
            setter(previous)
