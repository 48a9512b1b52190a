"""Your own tests of a PIT module, run together with pitcheck's checks of it.

    pytest test_mypit.py --pitcheck mypit.py:make --pitcheck-vocab 64 --pitcheck-dim 8 --junitxml pitcheck.xml

The plugin (installed with pitcheck, inert without --pitcheck) adds one item per check, named
`pitcheck[mypit.py:make-float32-penrose]`, so -k, -m pitcheck, --junitxml and expected failures work as
usual. Its options: --pitcheck-dtype float32,bfloat16, --pitcheck-checks penrose,gradients,
--pitcheck-vocab/-dim/-steps/-timeout, --pitcheck-xfail FILE (a check name or item id per line, '# reason'),
--pitcheck-world-size N (a vocabulary-parallel module). An inconclusive check is reported as skipped, with its
reason.
"""
import torch

from mypit import make


def test_embed_and_logits_are_pseudo_inverses():
    module = make(64, 8, dtype=torch.float64, device="cpu", seed=0)
    E = module.embed(torch.arange(64))          # V x D
    W = module.logits(torch.eye(8, dtype=torch.float64))   # D x V
    assert torch.allclose(W @ E, torch.eye(8, dtype=torch.float64), atol=1e-12)


def test_post_step_keeps_z_orthonormal():
    module = make(64, 8, dtype=torch.float32, device="cpu", seed=0)
    with torch.no_grad():
        module.Z.add_(0.01 * torch.randn_like(module.Z))
    module.post_step()
    gram = module.Z.T @ module.Z
    assert torch.linalg.matrix_norm(gram - torch.eye(8)) < 1e-5
