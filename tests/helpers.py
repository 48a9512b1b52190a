"""Shared test fixtures' building blocks."""
from pathlib import Path

import numpy as np

from pitcheck.numerics import reference
from pitcheck.infra.rundir import npz_bytes


def pit_pair(vocab, dim, cond, seed=0):
    """A random orthonormal Z and the Cholesky factor of an SPD T with the given condition number."""
    rng = np.random.default_rng(seed)
    Z = reference.random_memory(vocab, dim, rng)
    L = reference.cholesky_factor(reference.spd_with_condition(dim, cond, rng))
    return Z, L


def orthonormal(rows, cols, seed=0):
    """A random rows x cols matrix with orthonormal columns: the QR factor of a Gaussian drawn from `seed`, its
    columns' signs fixed so that R has a positive diagonal (Haar-distributed)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((rows, cols)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def damage_run_file(path: Path, how: str) -> None:
    """Damage one file of a run directory: 'truncated', 'empty', 'garbage' or 'nan' (a NaN where a number
    belongs). The damage must change the file."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(300))
    elif path.name == "checkpoint.npz":
        with np.load(path) as ck:
            arrays = {k: ck[k] for k in ck.files}
        arrays["engine_master_Z"] = np.where(arrays["engine_master_Z"] > 0, np.nan, arrays["engine_master_Z"])
        path.write_bytes(npz_bytes(arrays))
    elif path.name == "metrics.csv":
        path.write_text(path.read_text().replace("\n1,", "\nnan,", 1))
    elif path.name == "manifest.json":
        path.write_text(path.read_text().replace('"lr": 0.01', '"lr": NaN'))
    else:
        path.write_text('{"step": NaN, "event": "x"}\n' + path.read_text())
    assert path.read_bytes() != data, f"{path.name} {how}: damage changed nothing"


def stress_args(files, **options):
    """`pitcheck stress FILES --option value ...` parsed by the verb's own parser (True: a bare flag)."""
    import argparse

    from pitcheck.cli import stress

    parser = argparse.ArgumentParser()
    stress.add_parser(parser.add_subparsers(dest="command"))
    argv = ["stress", *map(str, files)]
    for k, v in options.items():
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return parser.parse_args(argv)


# the smallest stress scenario file: one fp64 run of two steps with a loose budget
TINY_SCENARIO = """
[scenario.t]
backend = "numpy"
precision = "fp64"
steps = 2
vocab = 16
dim = 4
[scenario.t.budget]
orthonormality = 1.0
"""
