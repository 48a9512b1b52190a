"""The lm source: a small causal transformer whose embedding and head are a run's engine.

Forward: token ids -> the engine's embedding rows (PIT: e_v = T^{-1} z_v by two triangular solves on the
batch's rows; tied/untied: rows of E) -> + learned positions -> `layers` pre-norm blocks (one-head causal
attention, a 4D-wide GELU MLP) -> final layer norm -> the engine's head (PIT: (h T) Z^T; tied: h E^T;
untied: h B^T) -> mean next-token cross-entropy. Everything is float64 on the CPU, computed from the
stored interface as float64 copies (so a bf16 Z is used with its bf16 values): as for every adversary, the
precision policy governs the interface (storage, gradient format, step, retraction), not this stream.

Batches are a function of (seed, step) alone, so a resumed run and the float64 shadow see the same
tokens. The body's weights, Adam moments and step count are the source's state: `state_dict()` goes into
the run's checkpoint with the engine's. A step's body gradients wait in `pending` until the run knows
the interface step was taken (`advance()`), as a skipped AMP step skips the whole model.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .params import NAME
from .corpus import load_corpus

BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
INIT_STD = 0.02
LN_EPS = 1e-5
# a stream apart from the adversaries' ([seed, step, index]) and the initial state's
BATCH_STREAM, INIT_STREAM = 2**31 + 101, 2**31 + 102


def _tensor(a) -> torch.Tensor:
    """A float64 tensor in torch's own (64-byte aligned) memory: MKL's results can depend on the alignment
    of their operands, and numpy's buffers are aligned less, differently from run to run."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).clone()


def body_shapes(dim: int, layers: int, seq_len: int) -> dict[str, tuple]:
    shapes = {"pos": (seq_len, dim)}
    for i in range(layers):
        shapes.update({f"b{i}.ln1_g": (dim,), f"b{i}.ln1_b": (dim,), f"b{i}.wq": (dim, dim), f"b{i}.wk": (dim, dim),
                       f"b{i}.wv": (dim, dim), f"b{i}.wo": (dim, dim), f"b{i}.ln2_g": (dim,),
                       f"b{i}.ln2_b": (dim,), f"b{i}.w1": (dim, 4 * dim), f"b{i}.c1": (4 * dim,),
                       f"b{i}.w2": (4 * dim, dim), f"b{i}.c2": (dim,)})
    shapes.update({"lnf_g": (dim,), "lnf_b": (dim,)})
    return shapes


def initial_body(dim: int, layers: int, seq_len: int, seed: int) -> dict[str, np.ndarray]:
    """Gains 1, biases 0, weights N(0, 0.02^2): drawn by numpy from the seed, the same on every machine."""
    rng = np.random.default_rng([seed, INIT_STREAM])
    out = {}
    for name, shape in body_shapes(dim, layers, seq_len).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("_g"):
            out[name] = np.ones(shape)
        elif leaf.endswith("_b") or leaf in ("c1", "c2"):
            out[name] = np.zeros(shape)
        else:
            out[name] = rng.standard_normal(shape) * INIT_STD
    return out


def _layer_norm(x, g, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LN_EPS) * g + b


class Head:
    """The engine's embedding and head as differentiable float64 maps of its stored tables."""

    def __init__(self, engine):
        self.kind = engine.head
        self.pit = engine.model.has_retraction  # PIT's Z and L, or the baselines' tables
        A, B = engine.stored()
        self.leaves = {}
        if self.pit:
            self.leaves = {"Z": _tensor(A), "L": _tensor(B)}
        else:
            self.leaves = {"E": _tensor(A)}
            if self.kind == "untied":
                self.leaves["B"] = _tensor(B)

    def requires_grad(self) -> list:
        for t in self.leaves.values():
            t.requires_grad_(True)
        return list(self.leaves.values())

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.pit:
            return self.leaves["E"][ids]
        Z, L = self.leaves["Z"], self.leaves["L"]
        # two triangular solves on the distinct rows of the batch only
        rows, inverse = torch.unique(ids, return_inverse=True)
        y = torch.linalg.solve_triangular(L, Z[rows].T, upper=False)
        e = torch.linalg.solve_triangular(L.T, y, upper=True).T
        return e[inverse]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.pit:
            Z, L = self.leaves["Z"], self.leaves["L"]
            return ((h @ L) @ L.T) @ Z.T
        return h @ (self.leaves["B"] if self.kind == "untied" else self.leaves["E"]).T

    def gradients(self, grads: list) -> dict[str, np.ndarray]:
        out = {k: g.numpy() for k, g in zip(self.leaves, grads)}
        if "L" in out:
            out["L"] = np.tril(out["L"])
        return out


class LMSource:
    name = NAME

    def __init__(self, config, engine):
        self.params = config.lm
        self.seed = config.seed
        self.input_scale = float(config.adversary_params.input_scale)
        self.corpus = load_corpus(config.vocab, config.lm.vocabulary)
        p = self.params
        need = p.seq_len + 1
        if self.corpus.train.size <= need or self.corpus.heldout.size < need:
            from ...infra.errors import PitcheckError

            raise PitcheckError(f"lm.seq_len {p.seq_len} is longer than the text")
        self.dim = config.dim
        self.body = {k: _tensor(v) for k, v in initial_body(config.dim, p.layers, p.seq_len,
                                                                      config.seed).items()}
        self.m = {k: torch.zeros_like(v) for k, v in self.body.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.body.items()}
        self.t = 0
        self.pending: dict | None = None
        self.eval_train = self._windows(self.corpus.train, p.eval_sequences)
        self.eval_heldout = self._windows(self.corpus.heldout, p.eval_sequences)

    def _windows(self, tokens: np.ndarray, count: int) -> torch.Tensor:
        """`count` evenly spaced windows of seq_len + 1 tokens (overlapping when the text is short)."""
        need = self.params.seq_len + 1
        starts = np.linspace(0, tokens.size - need, count).round().astype(np.int64)
        return torch.from_numpy(np.stack([tokens[s:s + need] for s in starts]))

    def batch(self, step: int) -> np.ndarray:
        """The training batch of this step: sequences x (seq_len + 1) token ids, from (seed, step) alone."""
        p = self.params
        rng = np.random.default_rng([self.seed, step, BATCH_STREAM])
        starts = rng.integers(0, self.corpus.train.size - p.seq_len, size=p.sequences)
        return np.stack([self.corpus.train[s:s + p.seq_len + 1] for s in starts])

    # ---- the model ---------------------------------------------------------------------------
    def _forward(self, head: Head, body: dict, windows: torch.Tensor, scale_input: bool = False):
        ids, targets = windows[:, :-1], windows[:, 1:]
        x = head.embed(ids)
        if scale_input and self.input_scale != 1.0:
            # input-side gradient scaling: the forward value is untouched, the table's input gradient scaled
            x.register_hook(lambda g: g * self.input_scale)
        S = ids.shape[1]
        x = x + body["pos"][:S]
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        for i in range(self.params.layers):
            b = lambda k: body[f"b{i}.{k}"]  # noqa: E731
            a = _layer_norm(x, b("ln1_g"), b("ln1_b"))
            q, k, v = a @ b("wq"), a @ b("wk"), a @ b("wv")
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.dim)
            att = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            x = x + (att @ v) @ b("wo")
            a = _layer_norm(x, b("ln2_g"), b("ln2_b"))
            x = x + F.gelu(a @ b("w1") + b("c1")) @ b("w2") + b("c2")
        h = _layer_norm(x, body["lnf_g"], body["lnf_b"])
        logits = head.logits(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def add_gradients(self, engine, base: dict, step: int) -> dict:
        """base (the other models' gradients) plus this step's LM gradients for the engine's tables; the
        body's gradients wait in `pending` for advance()."""
        head = Head(engine)
        leaves = head.requires_grad()
        body = {k: v.detach().requires_grad_(True) for k, v in self.body.items()}
        loss = self._forward(head, body, torch.from_numpy(self.batch(step)), scale_input=True)
        grads = torch.autograd.grad(loss, leaves + list(body.values()))
        table = head.gradients(list(grads[:len(leaves)]))
        self.pending = dict(zip(body, grads[len(leaves):]))
        self.last_loss = float(loss.detach())
        return {k: base[k] + table[k] for k in base}

    def advance(self) -> None:
        """Adam on the body with the gradients of the step just taken (new tensors: snapshots stay valid)."""
        if self.pending is None:
            return
        self.t += 1
        lr, t = self.params.body_lr, self.t
        for k, g in self.pending.items():
            self.m[k] = BETA1 * self.m[k] + (1 - BETA1) * g
            self.v[k] = BETA2 * self.v[k] + (1 - BETA2) * g * g
            m_hat = self.m[k] / (1 - BETA1**t)
            v_hat = self.v[k] / (1 - BETA2**t)
            self.body[k] = self.body[k] - lr * m_hat / (torch.sqrt(v_hat) + ADAM_EPS)
        self.pending = None

    def discard(self) -> None:
        """The interface step was skipped: so is the body's."""
        self.pending = None

    @torch.no_grad()
    def losses(self, engine) -> dict[str, float]:
        """Mean next-token cross-entropy (nats/token) on the fixed training and held-out windows."""
        head = Head(engine)
        return {"train_loss": float(self._forward(head, self.body, self.eval_train)),
                "heldout_loss": float(self._forward(head, self.body, self.eval_heldout))}

    @torch.no_grad()
    def shadow_losses(self, shadow) -> dict[str, float]:
        """What the float64 shadow's row adds: its held-out loss."""
        return {"shadow_heldout_loss": self.losses(shadow)["heldout_loss"]}

    @staticmethod
    def loss_columns(shadow: bool) -> set[str]:
        """The loss columns every recorded row of a run with this source has."""
        return {"train_loss", "heldout_loss"} | ({"shadow_heldout_loss"} if shadow else set())

    # ---- state -------------------------------------------------------------------------------
    def snapshot(self) -> tuple:
        return dict(self.body), dict(self.m), dict(self.v), self.t

    def restore(self, snap: tuple) -> None:
        body, m, v, self.t = snap
        self.body, self.m, self.v = dict(body), dict(m), dict(v)
        self.pending = None

    def state_dict(self) -> dict[str, np.ndarray]:
        d = {"t": np.int64(self.t)}
        for prefix, table in (("w.", self.body), ("m.", self.m), ("v.", self.v)):
            d.update({prefix + k: t.numpy() for k, t in table.items()})
        return d

    def load_state_dict(self, d: dict) -> None:
        self.t = int(d["t"])
        for prefix, table in (("w.", self.body), ("m.", self.m), ("v.", self.v)):
            for k in list(table):
                table[k] = _tensor(d[prefix + k])
        self.pending = None

    def describe(self) -> dict:
        n_body = sum(int(t.numel()) for t in self.body.values())
        return {**self.corpus.describe(), **self.params.to_json(), "input_scale": self.input_scale,
                "body_parameters": n_body, "body": "float64, Adam", "batch_stream": BATCH_STREAM}
