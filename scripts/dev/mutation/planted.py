"""The one-line bugs of issues 10 and 21 that once survived the whole suite, each with the test that now kills it.

(module, original text, mutated text, killing test). run.py --planted applies each to a temporary copy
and runs its test alone: every one must fail. The original text must occur exactly once in the module.
"""
M, T = "pitcheck/numerics/metrics.py", "tests/numerics/test_metrics.py::"
CT = "tests/infra/test_commit_thread.py::"
TR = "tests/model/retractions/test_retractions.py::"
PLANTED = [
    # pinv_drift and the Penrose residuals from the exact E = Z T^{-1} instead of the computed rows
    (M, "out.update(checked_head_metrics(E, B, work))",
     "out.update(checked_head_metrics(Z @ np.linalg.inv(L @ L.T), B, work))",
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
    ("pitcheck/numerics/policy.py", "return max(FORMATS[self.storage].u, FORMATS[self.matmul].u, placed)",
     "return max(FORMATS[self.storage].u, placed)",
     "tests/numerics/test_policy.py::test_policy_u_is_the_coarsest_of_storage_and_matmul"),
    # the sign of the softplus inverse
    ("pitcheck/numerics/reference.py", "return y + np.log(-np.expm1(-y))", "return y - np.log(-np.expm1(-y))",
     "tests/numerics/test_reference.py::test_softplus_inverse_sign_and_closed_form"),
    # the tangent projection without its symmetrisation
    ("pitcheck/model/retractions/common.py", "return G - ops.matmul(Z, _sym(ops.matmul(Z.T, G)))",
     "return G - ops.matmul(Z, ops.matmul(Z.T, G))",
     TR + "test_tangent_projection_symmetrises_a_non_symmetric_ZtG"),
    # polar-ns coefficients changed: a wrong fixed point ...
    ("pitcheck/model/retractions/polar.py", "Y = ops.matmul(Y, 1.5 * eye - 0.5 * G)", "Y = ops.matmul(Y, 1.5 * eye - 0.45 * G)",
     TR + "test_polar_retractions_give_the_exact_polar_factor"),
    # ... or the right fixed point reached linearly, not quadratically
    ("pitcheck/model/retractions/polar.py", "Y = ops.matmul(Y, 1.5 * eye - 0.5 * G)", "Y = ops.matmul(Y, 1.4 * eye - 0.4 * G)",
     TR + "test_polar_ns_converges_quadratically_to_full_precision_near_the_manifold"),
    # cayley-iter with one iteration instead of two
    ("pitcheck/model/retractions/cayley.py", "retract_cayley_iter(Z, xi, ops=None, iterations: int = 2)",
     "retract_cayley_iter(Z, xi, ops=None, iterations: int = 1)",
     TR + "test_cayley_iter_two_iterations_in_closed_form"),
    ("pitcheck/model/retractions/cayley.py", "retract_cayley_iter(Z, xi, ops=None, iterations: int = 2)",
     "retract_cayley_iter(Z, xi, ops=None, iterations: int = 1)",
     TR + "test_cayley_iter_truncation_error_is_fourth_order_for_two_iterations"),
]

# ---- the emulation, the engine, the gradient models, the run's events, the oracle ----
A, EN, GR = "pitcheck/numerics/arrays.py", "pitcheck/model/engine.py", "pitcheck/model/gradients.py"
AMP, HD, OPT = "pitcheck/model/amp.py", "pitcheck/model/heads.py", "pitcheck/model/optim.py"
TA, TE, TG = "tests/numerics/test_arrays.py::", "tests/model/test_engine.py::", "tests/model/test_gradients.py::"
PLANTED += [
    # tf32 operand rounding with ties away from zero instead of to even (the numpy path CPU tensors take) ...
    (A, "y = (bits >> drop) & 1", "y = np.ones_like(bits)", TA + "test_tf32_rounding_of_exact_ties_goes_to_even"),
    # ... and in torch's kernels (tensors on CUDA or requiring grad), held to the numpy path's bits
    (A, "bias = (1 << (drop - 1)) - 1 + ((bits >> drop) & 1)", "bias = 1 << (drop - 1)",
     TA + "test_round_float32_on_a_cpu_tensors_memory_gives_torchs_bits"),
    # ... or keeping 12 significand bits instead of 11
    (A, "drop = 24 - fmt.p", "drop = 23 - fmt.p", TA + "test_tf32_rounding_keeps_11_bits_not_12"),
    # an emulated bf16/fp16 matmul that does not round its product back to the low format
    (A, "return (a.to(low).to(a.dtype) @ b.to(low).to(a.dtype)).to(low).to(a.dtype)",
     "return a.to(low).to(a.dtype) @ b.to(low).to(a.dtype)", TA + "test_emulated_bf16_matmul_rounds_its_product"),
    (A, "return (a.to(low).to(a.dtype) @ b.to(low).to(a.dtype)).to(low).to(a.dtype)",
     "return a.to(low).to(a.dtype) @ b.to(low).to(a.dtype)", TA + "test_emulated_fp16_matmul_rounds_its_product_and_overflows"),
    # fp16 gradients not unscaled
    (EN, "return {k: self.scaler.unscale(self.arrays.to(g, p.factor)) for k, (g, _) in cast.items()}, []",
     "return {k: self.arrays.to(g, p.factor) for k, (g, _) in cast.items()}, []",
     TE + "test_fp16_gradients_are_unscaled_before_the_step"),
    # a loss scale that never grows: the clean-step count reset every step ...
    (AMP, "self.good_steps += 1", "self.good_steps = 1",
     TE + "test_the_loss_scale_after_2001_clean_steps_is_doubled_once"),
    # ... or grown one step late
    (AMP, "if self.good_steps >= LOSS_SCALE_GROWTH_INTERVAL:", "if self.good_steps > LOSS_SCALE_GROWTH_INTERVAL:",
     TE + "test_the_loss_scale_after_2001_clean_steps_is_doubled_once"),
    # the softplus chain factor dropped from the diagonal's gradient
    (HD, 'gl = ops.tril(gl, -1) + ops.diag(ops.diag(gl) * ops.sigmoid(ops.diag(point["raw"])))',
     "gl = ops.tril(gl, -1) + ops.diag(ops.diag(gl))",
     TE + "test_one_sgd_step_by_hand_with_the_softplus_chain_factor_on_the_diagonal"),
    # the step direction not re-projected onto the tangent space before the retraction
    (HD, 'xi = tangent_projection(Z, -s.lr * directions["Z"], ops)', 'xi = -s.lr * directions["Z"]',
     TE + "test_the_step_is_reprojected_onto_the_tangent_space_before_the_retraction"),
    (HD, 'xi = tangent_projection(Z, -s.lr * directions["Z"], ops)', 'xi = -s.lr * directions["Z"]',
     TE + "test_momentum_reprojects_its_remembered_direction_at_the_new_point"),
    # Adam without bias correction
    (OPT, "m_hat = m / (1 - BETA1**t)\n    v_hat = v / (1 - BETA2**t)", "m_hat = m\n    v_hat = v",
     TE + "test_one_adam_step_by_hand"),
    # a threshold event recorded at every record above the level instead of at the first crossing
    ("pitcheck/trajectory/events.py",
     'new = [lv for lv in levels if row[metric] > lv and f"{metric}>{lv:g}" not in raised]',
     "new = [lv for lv in levels if row[metric] > lv]",
     "tests/trajectory/test_events.py::test_a_threshold_event_is_recorded_at_the_first_crossing_only"),
    # the dense-output model's T-gradient with its sign flipped ...
    (GR, "GT = h.T @ (dlogit @ Z)", "GT = -h.T @ (dlogit @ Z)",
     TG + "test_dense_output_L_gradient_is_the_cross_entropy_gradient_to_fd_truncation"),
    # ... or without its symmetrisation
    (GR, "return (GT + GT.T) @ L", "return 2 * GT @ L",
     TG + "test_dense_output_L_gradient_is_the_cross_entropy_gradient_to_fd_truncation"),
    # the commit thread: a commit queued behind a failed one written all the same (its kept files
    # are the failed commit's, which never landed) ...
    ("pitcheck/infra/rundir.py", "        if self.failed is not None:\n            return\n        try:\n            write(*args)",
     "        try:\n            write(*args)",
     CT + "test_a_failed_later_commit_raises_at_drain_and_nothing_after_it_is_written"),
    # ... its error never raised ...
    ("pitcheck/infra/rundir.py", "            self.raised = True\n            raise self.failed\n", "            self.raised = True\n",
     CT + "test_a_failed_later_commit_raises_at_drain_and_nothing_after_it_is_written"),
    # ... a commit made after it not refused ...
    ("pitcheck/infra/rundir.py", "        self.queue.check()\n        kept = ", "        kept = ",
     CT + "test_a_failed_later_commit_raises_at_drain_and_nothing_after_it_is_written"),
    # ... or a forked child handed its parent's executor, whose thread it does not have
    ("pitcheck/infra/rundir.py", "if _COMMITTER is None or _COMMITTER[0] != os.getpid():", "if _COMMITTER is None:",
     CT + "test_a_forked_child_makes_its_own_commit_thread"),
    # events.jsonl's kept lines reused for a list whose earlier events changed
    ("pitcheck/infra/rundir.py", "        if len(events) < n or any(a is not b for a, b in zip(events, self.events)):\n",
     "        if len(events) < n:\n", CT + "test_event_lines_encode_the_new_events_only_and_a_changed_list_whole"),
    # the oracle at 16 digits instead of 50
    ("tests/oracle.py", "DIGITS = 50", "DIGITS = 16",
     "tests/test_oracle.py::test_oracle_resolves_a_residual_far_below_float64_u"),
]
