"""One optimisation step: the retractions (single and stacked), the heads, the engine that steps one
(and the stacked engine that steps B as one), optimizers, loss scaling, the array backend, the gradient
models the heads are driven by (gradients, stacked_gradients and their streams), the reference PIT
module (nn, nn_sharded: public as pitcheck.nn and pitcheck.nn_sharded) and the distributed maps (sharded/).

Nothing is imported here: `import pitcheck` stays free of numpy and torch.
"""
