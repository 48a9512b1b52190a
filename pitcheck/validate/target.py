"""Finding and building a validation target: `module:factory`, `path/to/file.py:factory`, or a callable.

The factory contract: `factory(vocab_size, hidden_size, *, dtype, device, seed)` returns a
torch.nn.Module with `embed(ids) -> (..., D)` and `logits(h) -> (..., V)`, optionally `post_step()`
and `configure_optimizer(params)`. A Hugging Face model (get_input_embeddings/get_output_embeddings)
is adapted to that contract.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ..errors import PitcheckError

DTYPES = ("float64", "float32", "bfloat16", "float16")
# unit roundoff u = 2^-p of each dtype a target may be asked for
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


class TargetError(PitcheckError):
    """The target could not be imported, built or run (exit status 2)."""


def describe_callable(factory) -> str:
    """`module:qualname` for a callable importable by that name, else ''."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        return ""
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except Exception:
        return ""
    return f"{module}:{name}" if obj is factory else ""


def split_target(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise TargetError(f"target {spec!r} is not of the form module:factory or path/to/file.py:factory")
    where, _, name = spec.rpartition(":")
    if not where or not name.isidentifier():
        raise TargetError(f"target {spec!r} is not of the form module:factory or path/to/file.py:factory")
    return where, name


def load_factory(spec: str):
    """Import the factory named by `spec` (runs the target's import-time code: call it in the worker)."""
    where, name = split_target(spec)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target file {where} does not exist")
        sys.path.insert(0, str(path.resolve().parent))
        # a name of its own: a target file called json.py must not replace the json module
        name_in_modules = f"_pitcheck_target_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name_in_modules, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name_in_modules] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    try:
        factory = getattr(module, name)
    except AttributeError:
        raise TargetError(f"{where} has no attribute {name!r}") from None
    if not callable(factory):
        raise TargetError(f"{spec} is not callable")
    return factory


class HuggingFaceAdapter:
    """A model with get_input_embeddings()/get_output_embeddings() seen through embed/logits."""

    def __new__(cls, model):
        import torch

        class Adapted(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def embed(self, ids):
                return self.inner.get_input_embeddings()(ids)

            def logits(self, h):
                return self.inner.get_output_embeddings()(h)

        return Adapted(model)


def build(factory, vocab: int, dim: int, dtype: str, device: str, seed: int):
    """Call the factory and check the result has the contract's methods; adapt Hugging Face models."""
    import torch

    module = factory(vocab, dim, dtype=getattr(torch, dtype), device=device, seed=seed)
    if not (hasattr(module, "embed") and hasattr(module, "logits")):
        if hasattr(module, "get_input_embeddings") and hasattr(module, "get_output_embeddings"):
            module = HuggingFaceAdapter(module)
        else:
            raise TargetError(f"the factory returned {type(module).__name__}, which has neither embed/logits "
                              "nor get_input_embeddings/get_output_embeddings")
    if not isinstance(module, torch.nn.Module):
        raise TargetError(f"the factory returned {type(module).__name__}, not a torch.nn.Module")
    return module


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise TargetError("--device cuda asked for, but torch sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise TargetError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return device
