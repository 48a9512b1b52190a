"""SmolLM2-135M's real body (30 Llama blocks, loaded by transformers from the GGUF file) and the heads a
continued-pretraining run puts on it: the model's own tied table, an untied pair initialised from E0, or
PIT (nn.PIT from a conversion of E0 in one of its modes, kept on the manifold by a named retraction).

Every head exposes embed(ids) -> (..., D), logits(h) -> (..., V), parameters() and post_step(); the body
is the model's LlamaModel run on inputs_embeds, so its own embedding and lm_head are never used.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ...infra.errors import PitcheckError
from .gguf_tables import INSTALL_HINT, SMOLLM2_FILE, smollm2_gguf

HEADS = ("tied", "untied", "pit")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's own tokenizer, built by transformers from the GGUF file's vocabulary and merges."""
    from transformers import AutoTokenizer  # deferred: seconds to import; an optional extra

    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=SMOLLM2_FILE)


def load_smollm2():
    """LlamaForCausalLM with SmolLM2's weights dequantised to float32 (about 30 s on 2 cores)."""
    try:
        from transformers import AutoModelForCausalLM  # deferred: an optional extra, seconds to import
        import gguf  # noqa: F401  transformers' GGUF loader needs it; say so in pitcheck's words
    except ImportError:
        raise PitcheckError(f"the SmolLM2 body needs transformers and gguf: {INSTALL_HINT}") from None
    path = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    if not model.config.tie_word_embeddings:
        raise PitcheckError(f"{path}: expected a tied model (tie_word_embeddings), got an untied one")
    model.train()
    return model


class TiedHead(torch.nn.Module):
    """Standard tying: one table E, embed = rows of E, logits = h E^T."""

    def __init__(self, E0: torch.Tensor):
        super().__init__()
        self.E = torch.nn.Parameter(E0.clone())

    def embed(self, ids):
        return torch.nn.functional.embedding(ids, self.E)

    def logits(self, h):
        return h @ self.E.T

    def post_step(self) -> None:
        pass

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(E, B): the embedding and W^T, for the interface metrics."""
        return self.E.detach(), self.E.detach()


class UntiedHead(TiedHead):
    """Untied: embedding E and head B, both initialised from E0, trained apart."""

    def __init__(self, E0: torch.Tensor):
        super().__init__(E0)
        self.B = torch.nn.Parameter(E0.clone())

    def logits(self, h):
        return h @ self.B.T

    def tables(self):
        return self.E.detach(), self.B.detach()


class PITHead(torch.nn.Module):
    """PIT from a conversion of E0 (pitcheck.nn.PIT: Z, L); with `scale`, one learned logit scale s outside
    PIT's formulation (logits s (h T) Z^T, s = exp(log_scale), started at the fitted value)."""

    def __init__(self, Z: np.ndarray, L: np.ndarray, retraction: str, dtype=torch.float32, scale: float | None = None):
        super().__init__()
        from .pit_module import pit_from

        self.pit = pit_from(Z, L, dtype=dtype, retraction=retraction)
        self.log_scale = None
        if scale is not None:
            self.log_scale = torch.nn.Parameter(torch.tensor(float(np.log(scale)), dtype=torch.float32))

    def embed(self, ids):
        return self.pit.embed(ids).to(torch.float32)

    def logits(self, h):
        out = self.pit.logits(h).to(torch.float32)
        return out if self.log_scale is None else out * torch.exp(self.log_scale)

    def scale(self) -> float:
        """The logit scale s (1 without one)."""
        return 1.0 if self.log_scale is None else float(torch.exp(self.log_scale.detach()))

    def post_step(self) -> None:
        self.pit.post_step()

    def tables(self):
        """(E, (T Z^T)^T): the PIT pair, before the logit scale (W E = s I is T Z^T E = I)."""
        from ...model.nn import memory_as_used

        with torch.no_grad():
            p = self.pit
            E = p.embed(torch.arange(p.vocab_size)).to(torch.float64)
            L = p.L.to(torch.float64)
            Z = memory_as_used(p.Z, p.dtype, p.compute_dtype).to(torch.float64)
        return E, Z @ (L @ L.T)


def make_head(kind: str, E0: np.ndarray, retraction: str = "qr", conversion=None, dtype=torch.float32):
    """A head on SmolLM2's body; a PIT head is built from `conversion` (its mode's Z, L and logit scale)."""
    if kind == "tied":
        return TiedHead(torch.from_numpy(E0.astype(np.float32)))
    if kind == "untied":
        return UntiedHead(torch.from_numpy(E0.astype(np.float32)))
    if kind == "pit":
        from .conversion import get_mode

        scale = conversion.scale if get_mode(conversion.mode).scaled else None
        return PITHead(conversion.Z, conversion.L, retraction, dtype, scale)
    raise PitcheckError(f"unknown head {kind!r}; choose from {', '.join(HEADS)}")


class BodyWithHead(torch.nn.Module):
    """SmolLM2's blocks and final norm between a head's embedding and its logits."""

    def __init__(self, model, head):
        super().__init__()
        self.body = model.model
        self.body.embed_tokens.weight.requires_grad_(False)  # replaced by the head's embedding
        self.head = head

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def loss(self, windows: torch.Tensor, autocast_dtype=None) -> torch.Tensor:
        """Mean next-token cross-entropy (nats/token) over windows (B x (S+1) token ids)."""
        inputs, targets = windows[:, :-1], windows[:, 1:]
        x = self.head.embed(inputs)
        with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            h = self.body(inputs_embeds=x).last_hidden_state
        logits = self.head.logits(h.to(torch.float32))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
