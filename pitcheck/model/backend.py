"""Where a model's arrays live and in which dtype each precision format is held: numpy (the float64
reference) or torch (any policy, on CPU or CUDA), with the policy's matmul emulated where the hardware
does not do it natively.
"""
from __future__ import annotations

import functools

import numpy as np

from ..numerics.arrays import NumpyOps, TorchOps
from ..infra.errors import PitcheckError
from ..numerics.formats import FORMATS
from ..numerics.policy import Policy


def host_buffer_like(x, pin_memory: bool = False):
    """An empty CPU tensor for a copy of x, laid out as x.to("cpu") lays it out (the strides of a dense x kept,
    found on the meta device without allocating), so that the checkpoint's arrays keep numpy's order."""
    import torch  # x's: loaded already

    strides = torch.empty_like(x, device="meta").stride()
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device="cpu", pin_memory=pin_memory)


def resolve_device(device: str) -> str:
    import torch  # deferred: torch takes seconds to import, and the numpy backend never needs it

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PitcheckError(f"--device {device} asked for, but torch sees no CUDA device")
    if device != "cpu" and not device.startswith("cuda"):
        raise PitcheckError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return device


class ArrayBackend:
    """The array ops, the device and a dtype per format for one policy: `to(x, fmt)` holds x in fmt."""

    def __init__(self, name: str, policy: Policy, device: str = "auto"):
        self.name = name
        self.emulated: list[str] = []
        self._copy_stream = None  # host_copy's CUDA stream, made on first use
        if name == "numpy":
            if policy.name != "fp64":
                raise PitcheckError(
                    f"the numpy backend is the float64 reference; run --precision {policy.name} "
                    "with --backend torch"
                )
            self.device = "cpu"
            self.ops = NumpyOps()
            self.dtypes = {"fp64": np.float64}
        elif name == "torch":
            import torch  # deferred: see resolve_device

            self.torch = torch
            self.device = resolve_device(device)
            self.dtypes = {
                "fp64": torch.float64,
                "fp32": torch.float32,
                "tf32": torch.float32,
                "bf16": torch.bfloat16,
                "fp16": torch.float16,
            }
            on_cuda = self.device.startswith("cuda")
            if on_cuda:
                # tf32 is native on CUDA; set explicitly so fp32 really is fp32
                torch.backends.cuda.matmul.allow_tf32 = policy.matmul == "tf32"
                torch.backends.cudnn.allow_tf32 = policy.matmul == "tf32"
            if policy.matmul == "tf32" and not on_cuda:
                self.ops = TorchOps(matmul_format=FORMATS["tf32"])
                self.emulated.append("tf32 matmul emulated on CPU by rounding operands to 11 bits")
            elif policy.matmul in ("bf16", "fp16"):
                self.ops = TorchOps(matmul_dtype=self.dtypes[policy.matmul], native=on_cuda)
                if not on_cuda:
                    self.emulated.append(f"{policy.matmul} matmul emulated on CPU: operands cast to "
                                         f"{policy.matmul}, fp32 accumulation, result rounded")
            else:
                self.ops = TorchOps()
            if policy.placement and on_cuda:
                self.emulated.append(f"placement {policy.placement.name}: copies of Z and L cast with torch's float8 "
                                     "dtypes where the recipe has a native path (pitcheck.native_float8); the "
                                     "logits head, moments and gradients emulated in float64 (pitcheck.scaling)")
            elif policy.placement:
                self.emulated.append(f"placement {policy.placement.name} emulated bit-exactly in float64 on the "
                                     "CPU (pitcheck.scaling), not native float8 GEMMs")
        else:
            raise PitcheckError(f"unknown backend {name!r}; choose numpy or torch")

    @staticmethod
    def nbytes(x) -> int:
        """The bytes an array or tensor holds."""
        return x.nbytes if isinstance(x, np.ndarray) else x.numel() * x.element_size()

    def to(self, x, fmt: str):
        """x held in format fmt on this backend (numpy: float64 whatever fmt, the reference's only format)."""
        if self.name == "numpy":
            return np.asarray(x, dtype=np.float64)
        if isinstance(x, np.ndarray):
            x = self.torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(self.device)
        dtype = self.dtypes[fmt]
        # x itself when it is held so already, as Tensor.to returns it, without its call (about 1 us, and a
        # batched step makes two dozen)
        return x if x.dtype is dtype else x.to(dtype)

    def numpy(self, x) -> np.ndarray:
        return self.ops.to_numpy(x)

    def host_copy(self, x):
        """numpy(x) later: a call that returns it. On CUDA the copy starts now, on a stream of its own into
        pinned host memory, so that it overlaps the steps queued after it; the call waits for it and casts to
        float64 (exact, as numpy's own cast). Elsewhere the conversion itself is left to the call. x is held
        until then: a step replaces its arrays and never writes into them."""
        if self.name != "torch" or x.device.type != "cuda":
            return functools.partial(self.numpy, x)
        torch = self.torch
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=x.device)
        stream = self._copy_stream
        stream.wait_stream(torch.cuda.current_stream(x.device))  # after the work that made x
        with torch.cuda.stream(stream):
            host = host_buffer_like(x, pin_memory=True)
            host.copy_(x.detach(), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)

        def result(x=x) -> np.ndarray:
            copied.synchronize()
            return host.to(torch.float64).numpy()

        return result

    @property
    def draw_device(self) -> str:
        """Where the counter gradient stream draws for this backend: its device (the CPU for numpy)."""
        return self.device

    def drawn(self, tensors: tuple) -> tuple:
        """Float64 torch draws (on draw_device) as this backend holds gradients: numpy arrays for numpy (the
        CPU tensors' own memory), the tensors themselves for torch."""
        return tuple(t.numpy() for t in tensors) if self.name == "numpy" else tuple(tensors)
