"""pitcheck.numerics.policy: where every quantity of a PIT model lives, one row per policy."""
import dataclasses

import pytest

from pitcheck.infra.errors import PitcheckError
from pitcheck.numerics.formats import FORMATS
from pitcheck.numerics.policy import POLICIES, Policy, get_policy

# name: storage, master, factor, matmul, gradient, loss scaling; u; mixed
# torch has no half-precision factorisation: every half policy factorises in fp32
POLICY_TABLE = [
    ("fp64", ("fp64", "fp64", "fp64", "fp64", "fp64", False), 2.0**-53, False),
    ("fp32", ("fp32", "fp32", "fp32", "fp32", "fp32", False), 2.0**-24, False),
    # u is the coarsest of storage and matmul: from the storage only, tf32 runs would report fp32's u
    ("tf32", ("fp32", "fp32", "fp32", "tf32", "fp32", False), 2.0**-11, False),
    ("bf16", ("bf16", "bf16", "fp32", "bf16", "bf16", False), 2.0**-8, False),
    ("fp16", ("fp16", "fp16", "fp32", "fp16", "fp16", True), 2.0**-11, False),
    ("bf16-mixed", ("bf16", "fp32", "fp32", "fp32", "bf16", False), 2.0**-8, True),
    ("fp16-mixed", ("fp16", "fp32", "fp32", "fp32", "fp16", True), 2.0**-11, True),
]


def test_the_registry_holds_these_policies_in_this_order():
    # then the placed policies (fp32 with an 8- or 4-bit placement: tests/numerics/test_placement.py)
    plain = [row[0] for row in POLICY_TABLE]
    assert list(POLICIES)[:len(plain)] == plain
    assert all(POLICIES[n].placement for n in list(POLICIES)[len(plain):])


@pytest.mark.parametrize("name,where,u,mixed", POLICY_TABLE)
def test_policy_table(name, where, u, mixed):
    p = get_policy(name)
    assert p is POLICIES[name] and p.name == name
    assert (p.storage, p.master, p.factor, p.matmul, p.gradient, p.loss_scaling) == where
    assert p.u == u == max(FORMATS[p.storage].u, FORMATS[p.matmul].u)
    assert p.mixed is mixed
    d = p.describe()
    assert d == {"name": name, "storage": where[0], "master": where[1], "factor": where[2], "matmul": where[3],
                 "gradient": where[4], "loss_scaling": where[5], "u": u}


def test_policy_u_is_the_coarsest_of_storage_and_matmul():
    assert get_policy("tf32").u == FORMATS["tf32"].u != FORMATS[get_policy("tf32").storage].u


def test_the_solves_unit_roundoff_is_their_arithmetic_and_stored_rows_not_a_coarser_matmul_or_placement():
    """cond(T) times solve_u bounds the embedding solves' forward error: a tf32 matmul or an E4M3 logits GEMM is
    not in them, so cond(T) = 2.3 is not beyond what an fp8-logits run's fp32 solves resolve (cond(T) times
    E4M3's u passes 0.1 there, which named T 'blown up' in every such run)."""
    fp32 = FORMATS["fp32"].u
    for name in ("fp32", "tf32", "fp8-logits", "fp8-gathered-z", "fp8-store", "nvfp4-store", "fp8-adam"):
        assert get_policy(name).solve_u == fp32, name
    assert get_policy("tf32").solve_u < get_policy("tf32").u
    assert get_policy("fp8-logits").solve_u * 2.3 < 0.1 < get_policy("fp8-logits").u * 2.3
    for name in ("fp64", "bf16", "fp16", "bf16-mixed"):  # the rows stored in the half format, solved in fp32
        assert get_policy(name).solve_u == get_policy(name).u == FORMATS[get_policy(name).storage].u


def test_an_unknown_policy_is_a_pitcheck_error():
    with pytest.raises(PitcheckError):
        get_policy("fp8")


def test_policy_mixed_is_master_differing_from_storage_and_policies_are_frozen():
    assert Policy("x", "fp32", "bf16", "fp32", "fp32", "fp32").mixed  # "bf16" < "fp32": not an ordering
    same = "".join(["fp", "32"])  # equal, not the same object
    assert not Policy("y", "fp32", same, "fp32", "fp32", "fp32").mixed
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_policy("fp32").storage = "bf16"
