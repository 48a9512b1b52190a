"""The one-line bugs of issue 10 that once survived the whole suite, each with the test that now kills it.

(module, original text, mutated text, killing test). run.py --planted applies each to a temporary copy
and runs its test alone: every one must fail. The original text must occur exactly once in the module.
"""
M, T = "pitcheck/metrics.py", "tests/test_pins_metrics.py::"
PLANTED = [
    # pinv_drift and the Penrose residuals from the exact E = Z T^{-1} instead of the computed rows
    (M, "out.update(head_metrics(E, B))", "out.update(head_metrics(Z @ np.linalg.inv(L @ L.T), B))",
     T + "test_interface_metrics_judge_the_embedding_rows_as_computed_not_the_exact_ones"),
    # orthonormality ratio over eps = 2u
    (M, "/ (vocab * u))", "/ (vocab * 2 * u))",
     T + "test_orthonormality_ratio_is_the_one_norm_over_vocab_times_u_not_eps"),
    # ... or in the Frobenius norm instead of LAPACK's 1-norm
    (M, "np.linalg.norm(deviation, 1)", "np.linalg.norm(deviation)",
     T + "test_orthonormality_ratio_is_the_one_norm_over_vocab_times_u_not_eps"),
    # triangular-solve backward ratio over eps
    (M, '"trisolve_backward_ratio": backward / u,', '"trisolve_backward_ratio": backward / (2 * u),',
     T + "test_trisolve_errors_pin_the_ratios_dtrt02_normalisation"),
    # ... or without the ||L|| ||L^T|| normalisation
    (M, "denom = np.linalg.norm(L, 1) * np.linalg.norm(L.T, 1) * np.abs(E_rows).sum(axis=1)",
     "denom = np.abs(E_rows).sum(axis=1)", T + "test_trisolve_errors_pin_the_ratios_dtrt02_normalisation"),
    # the overall penrose maximum dropping the fourth condition
    (M, 'out["penrose"] = max(pen.values())', 'out["penrose"] = max(list(pen.values())[:3])',
     T + "test_penrose_fourth_condition_alone_and_the_maximum_keeps_it"),
    # the breakdown margin ignoring the factor precision's u
    (M, "out.update(cholesky_conditioning(L, factor_u))", "out.update(cholesky_conditioning(L, u))",
     T + "test_interface_metrics_breakdown_margin_uses_the_factor_precision"),
    # the "precision cannot resolve" threshold moved
    (M, "cond_T * u <= 0.1 and", "cond_T * u <= 1.0 and",
     T + "test_precision_cannot_resolve_threshold_is_cond_u_at_one_tenth"),
    # the policy's u from the storage format only
    ("pitcheck/policy.py", "return max(FORMATS[self.storage].u, FORMATS[self.matmul].u)",
     "return FORMATS[self.storage].u",
     "tests/test_pins_formats_policy.py::test_policy_u_is_the_coarsest_of_storage_and_matmul"),
    # the sign of the softplus inverse
    ("pitcheck/reference.py", "return y + np.log(-np.expm1(-y))", "return y - np.log(-np.expm1(-y))",
     "tests/test_pins_reference.py::test_softplus_inverse_sign_and_closed_form"),
    # the tangent projection without its symmetrisation
    ("pitcheck/retractions.py", "return G - ops.matmul(Z, _sym(ops.matmul(Z.T, G)))",
     "return G - ops.matmul(Z, ops.matmul(Z.T, G))",
     "tests/test_pins_retractions.py::test_tangent_projection_symmetrises_a_non_symmetric_ZtG"),
    # polar-ns coefficients changed: a wrong fixed point ...
    ("pitcheck/retractions.py", "Y = ops.matmul(Y, 1.5 * eye - 0.5 * G)", "Y = ops.matmul(Y, 1.5 * eye - 0.45 * G)",
     "tests/test_pins_retractions.py::test_polar_retractions_give_the_exact_polar_factor"),
    # ... or the right fixed point reached linearly, not quadratically
    ("pitcheck/retractions.py", "Y = ops.matmul(Y, 1.5 * eye - 0.5 * G)", "Y = ops.matmul(Y, 1.4 * eye - 0.4 * G)",
     "tests/test_pins_retractions.py::test_polar_ns_converges_quadratically_to_full_precision_near_the_manifold"),
    # cayley-iter with one iteration instead of two
    ("pitcheck/retractions.py", "iterations: int = 2", "iterations: int = 1",
     "tests/test_pins_retractions.py::test_cayley_iter_two_iterations_in_closed_form"),
    ("pitcheck/retractions.py", "iterations: int = 2", "iterations: int = 1",
     "tests/test_pins_retractions.py::test_cayley_iter_truncation_error_is_fourth_order_for_two_iterations"),
]
