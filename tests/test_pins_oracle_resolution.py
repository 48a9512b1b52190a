"""The oracle resolves what float64 cannot: at 50 digits (about 166 bits) a residual far below float64's
u = 2^-53 relative to its terms comes out exactly; at 16 digits (about 56 bits) it would round away."""
import numpy as np

from pitcheck import oracle


def test_oracle_resolves_a_residual_far_below_float64_u():
    # Z = [1; 2^-30]: Z^T Z - 1 = 2^-60 exactly, 2^-7 of float64's u at 1 (float64 gives 0)
    Z = np.array([[1.0], [2.0**-30]])
    assert float((Z.T @ Z)[0, 0]) - 1 == 0.0
    assert oracle.orthonormality_loss(Z) == 2.0**-60
    # 2^-80: out of reach of 64 bits too
    assert oracle.orthonormality_loss(np.array([[1.0], [2.0**-40]])) == 2.0**-80


def test_oracle_pinv_drift_resolves_cancellation_below_u():
    # T = 1, Z = [1, 2^-35], E = Z: T Z^T E - 1 = 2^-70 exactly
    Z = np.array([[1.0], [2.0**-35]])
    assert oracle.pinv_drift(Z, np.eye(1), Z) == 2.0**-70


def test_oracle_embedding_is_the_correctly_rounded_quotient():
    # e = z / (l^2) with l = 1 + 2^-30: the exact quotient rounded once; a 56-bit oracle rounds twice
    l = 1 + 2.0**-30
    z = 1 + 2.0**-52
    want = float(__import__("fractions").Fraction(z) / (__import__("fractions").Fraction(l) ** 2))
    assert oracle.embed(np.array([[z]]), np.array([[l]]), [0])[0, 0] == want
    assert oracle.DIGITS == 50
