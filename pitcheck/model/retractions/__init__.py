"""Retractions on the Stiefel manifold {Z in R^{V x D}: Z^T Z = I}, registered by name.

Each retraction is `f(Z, xi, ops) -> Z_new` for a tangent step xi (Z^T xi skew), written once over the
common namespace in arrays.py, so numpy and torch run the same code. All cost O(V D^2): Cayley maps are
applied in low-rank form and never build the V x V skew matrix.

One record a map (registry.py): its one-matrix function, its stacked form over B x V x D (beside it, in
the same file), the name of its distributed form (pitcheck.model.sharded.retractions), plot style, table
order, approximate or not. A family of maps sharing helpers is one file: none, polar, qr (the Q-factor
maps), ns5, cayley, frontier (Muon-era orthogonalisers and landing); stacked.py is the stacked forms'
namespace, common.py the helpers all share.
"""
# imported in this order, the maps register in the order error messages list them
from . import registry, common, stacked, none, polar, qr, ns5, cayley, frontier

# where a name read through the package lives: the first of these modules that holds it (the one-matrix
# tangent_projection is common's; stacked's is stacked.tangent_projection)
_OWNERS = (registry, common, stacked, none, polar, qr, ns5, cayley, frontier)


def __getattr__(name: str):
    """Every name of the maps' modules, read at each access: a value set on its module (a test planting
    a constant there) is what the package shows, as when all of them were one module."""
    if not name.startswith("__"):
        for module in _OWNERS:
            if name in module.__dict__:
                return module.__dict__[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *(n for m in _OWNERS for n in m.__dict__ if not n.startswith("__"))})
