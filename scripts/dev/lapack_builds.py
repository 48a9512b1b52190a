"""The BLAS/LAPACK builds this process loads (threadpoolctl), and whether two of them give the same bits for
the factorisations batched cells rely on: numpy's stacked np.linalg.qr (numpy's bundled OpenBLAS) against
scipy's geqrf/orgqr per matrix (arrays.householder_qr, scipy's bundled OpenBLAS), at the grid's shape and
at the tests'. A difference here is why a stacked numpy QR must call the engine's own LAPACK.

    .venv/bin/python scripts/dev/lapack_builds.py
"""
import numpy as np
import scipy
from threadpoolctl import threadpool_info, threadpool_limits

from pitcheck.numerics.arrays import householder_qr

threadpool_limits(1)
print("numpy", np.__version__, "scipy", scipy.__version__)
for lib in threadpool_info():
    print(f"  {lib['user_api']}: {lib['filepath'].rsplit('/', 1)[-1]} {lib['version']} ({lib.get('architecture')})")
rng = np.random.default_rng(0)
for rows, cols in ((32, 4), (128, 8), (2048, 64)):
    x = rng.standard_normal((6, rows, cols))
    Qs, Rs = np.linalg.qr(x)
    differ = sum(not (np.array_equal(Q, q) and np.array_equal(R, r))
                 for Q, R, (q, r) in zip(Qs, Rs, map(householder_qr, x)))
    print(f"{rows} x {cols}: numpy's stacked QR differs from scipy's per matrix in {differ} of 6 matrices")
