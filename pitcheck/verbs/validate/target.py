"""Finding and building a validation target: `module:factory`, `path/to/file.py:factory`, or a callable.

The factory contract: `factory(vocab_size, hidden_size, *, dtype, device, seed)` returns a
torch.nn.Module with `embed(ids) -> (..., D)` and `logits(h) -> (..., V)`, optionally `post_step()`
and `configure_optimizer(params)`. A Hugging Face model (get_input_embeddings/get_output_embeddings)
is adapted to that contract.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from ...infra.errors import PitcheckError


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


def target_source(spec) -> Path | None:
    """The file a target's code is read from, found as load_factory would find it but without running
    any of it (no package's __init__ executes); None for a callable, a malformed spec, or a module not
    found. Outputs are checked against it: a --report named like the module would replace its code."""
    if not isinstance(spec, str):
        return None
    try:
        where, _ = split_target(spec)
    except TargetError:
        return None
    if where.endswith(".py"):
        return Path(where) if Path(where).is_file() else None
    parts = where.split(".")
    search = [str(Path.cwd()), *sys.path]
    found = None
    for part in parts:
        try:
            found = importlib.machinery.PathFinder.find_spec(part, search)
        except (ImportError, ValueError):
            return None
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    origin = getattr(found, "origin", None)
    return Path(origin) if origin and Path(origin).is_file() else None


def load_factory(spec: str):
    """Import the factory named by `spec` (runs the target's import-time code: call it in the worker).

    `path/file.py:factory` is loaded from its file; `module:factory` is found from the working directory
    first, as `python -c 'import module'` finds it. Neither directory goes before the standard library
    and site-packages on sys.path: a random.py or json.py beside the target must not replace the modules
    pitcheck, torch and the target itself import by those names.
    """
    where, name = split_target(spec)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target file {where} does not exist")
        _append_to_path(path.resolve().parent)  # the target's own imports of the files beside it
        # a name of its own: a target file called json.py must not replace the json module
        name_in_modules = f"_pitcheck_target_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name_in_modules, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name_in_modules] = module
        module_spec.loader.exec_module(module)
    else:
        cwd = Path.cwd()
        _append_to_path(cwd)
        top = where.partition(".")[0]
        local = importlib.machinery.PathFinder.find_spec(top, [str(cwd)])
        reserved = top in sys.modules or top in getattr(sys, "stdlib_module_names", ())
        if local is not None and not reserved:
            _import_from(local, top)  # the working directory's package wins over an installed one of its name
        try:
            module = importlib.import_module(where)
        except ImportError:
            if local is not None and reserved and not _same_file(local, top):
                raise TargetError(_shadow_hint(local, top, name)) from None
            raise
        if local is not None and reserved and not hasattr(module, name) and not _same_file(local, top):
            raise TargetError(_shadow_hint(local, top, name))
    try:
        factory = getattr(module, name)
    except AttributeError:
        raise TargetError(f"{where} has no attribute {name!r}") from None
    if not callable(factory):
        raise TargetError(f"{spec} is not callable")
    return factory


def _append_to_path(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.append(str(directory))


def _import_from(module_spec, name: str) -> None:
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _same_file(module_spec, name: str) -> bool:
    """Whether the module already imported under `name` is the one `module_spec` found (pitcheck.nn:make
    validated from pitcheck's own checkout)."""
    loaded = getattr(sys.modules.get(name), "__file__", None)
    return bool(loaded and module_spec.origin) and Path(loaded).resolve() == Path(module_spec.origin).resolve()


def _shadow_hint(local, top: str, name: str) -> str:
    try:
        file = Path(local.origin).relative_to(Path.cwd())
    except (TypeError, ValueError):
        file = local.origin
    return f"{top!r} would replace the standard library's or pitcheck's module of that name; give the file: {file}:{name}"


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
    check_placement(module, device)
    return module


def check_placement(module, device: str) -> None:
    """A module whose parameters or buffers are on another device than the one asked for cannot be run
    there: on 'meta' they hold no values (every read raises), elsewhere each probe would fail on a device
    mismatch. One reason at build, not a failure in every check."""
    elsewhere: dict[str, list[str]] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        kind = tensor.device.type
        if kind != device:
            elsewhere.setdefault(kind, []).append(name)
    if not elsewhere:
        return
    where = "; ".join(f"on the {kind} device ({_some(names)})" for kind, names in elsewhere.items())
    why = ": meta tensors hold no values" if "meta" in elsewhere else ""
    raise TargetError(f"the factory's module has tensors {where}, not on {device} as asked{why}")


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise TargetError("--device cuda asked for, but torch sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise TargetError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return device
