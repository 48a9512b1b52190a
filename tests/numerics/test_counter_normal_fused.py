"""The one-kernel counter-normal draw (pitcheck.numerics.counter_normal_fused) gives the unfused draw's bits.

On CUDA the kernel itself is compared (and `normals` must pick it); where Triton is installed without a GPU,
its interpreter runs the same kernel on the CPU in a subprocess (TRITON_INTERPRET must be set before Triton is
imported). The check that guards the kernel in a run, `agrees`, is shown to refuse a draw one bit off."""
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from pitcheck.numerics import counter_normal as cn
from pitcheck.numerics import counter_normal_fused as fused

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = fused.triton is not None
CASES = [((2049, 65), 3, 2**32 + 7, 11, None), ((1000, 3), 0, 0, 0, (333, 777)), ((7,), 2**32 - 1, 2**64 - 1, 5, None),
         ((129, 17), 12345, 99, 2**31, (1, 2))]


def same_bits(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int64).cpu(), b.view(torch.int64).cpu())


def test_agrees_accepts_the_unfused_draw_and_refuses_one_a_bit_off():
    def one_bit_off_past_2_to_the_32(out, start, *args):
        cn.fill_by_passes(out, start, *args)
        if start > 2**32:  # only the case whose counters' second word turns over
            out.view(torch.int64)[-1] ^= 1

    assert fused.agrees("cpu", fill=cn.fill_by_passes)
    assert not fused.agrees("cpu", fill=one_bit_off_past_2_to_the_32)


def test_the_cpu_draws_by_passes_and_never_runs_the_kernel_check():
    fused._READY.clear()
    assert same_bits(fused.normals((4, 4), 1, 2, 3), cn.normals((4, 4), 1, 2, 3))
    assert fused._READY == {} and not fused.ready(torch.device("cpu"))


def test_a_kernel_that_fails_its_check_warns_once_and_the_draw_stays_the_unfused_stream(monkeypatch):
    fake = torch.device("cuda", 0)
    monkeypatch.setattr(fused, "_READY", {})
    monkeypatch.setattr(fused, "agrees", lambda device: False)
    with pytest.warns(RuntimeWarning, match="bits differ"):
        assert not fused.ready(fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not fused.ready(fake)  # decided once a process and device
    monkeypatch.setattr(fused, "_READY", {})
    monkeypatch.setattr(fused, "agrees", lambda device: 1 / 0)
    with pytest.warns(RuntimeWarning, match="unavailable.*ZeroDivisionError"):
        assert not fused.ready(fake)


def test_the_environment_switch_turns_the_kernel_off(monkeypatch):
    monkeypatch.setenv("PITCHECK_FUSED_NORMALS", "0")
    monkeypatch.setattr(fused, "_READY", {})
    assert not fused.ready(torch.device("cuda", 0)) and fused._READY == {}


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and Triton")
@pytest.mark.parametrize("shape,seed,step,index,rows", CASES)
def test_the_cuda_kernel_is_the_unfused_draw_bit_for_bit(shape, seed, step, index, rows):
    got = fused.normals(shape, seed, step, index, device="cuda", rows=rows, fused=True)
    assert same_bits(got, cn.normals(shape, seed, step, index, device="cuda", rows=rows))
    assert same_bits(got, cn.normals(shape, seed, step, index, rows=rows))  # the CPU's draw


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and Triton")
def test_normals_on_cuda_picks_the_checked_kernel():
    fused._READY.clear()
    fused.normals((8, 8), 0, 0, 0, device="cuda")
    assert fused._READY == {f"cuda:{torch.cuda.current_device()}": True}


@pytest.mark.skipif(torch.cuda.is_available() or not HAS_TRITON, reason="needs Triton without CUDA (its interpreter)")
def test_the_kernel_under_triton_s_interpreter_is_the_unfused_draw_bit_for_bit():
    script = textwrap.dedent(f"""
        import torch
        from pitcheck.numerics import counter_normal as cn, counter_normal_fused as fused
        for shape, seed, step, index, rows in {CASES!r}:
            a = fused.normals(shape, seed, step, index, rows=rows, fused=True)
            b = cn.normals(shape, seed, step, index, rows=rows)
            assert torch.equal(a.view(torch.int64), b.view(torch.int64)), (shape, seed, step, index, rows)
        assert fused.agrees("cpu")  # the kernel: normals' cases and blocks past 2^32
        print("same bits")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-2000:]


def _ptx(fusion: bool, word: str = "i64") -> str:
    """The kernel compiled for a Hopper GPU (sm_90) as a launch compiles it, its integer arguments typed `word`
    (Triton types a Python int argument i32 below 2^31): Triton builds PTX without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = dict(fused._CONSTANTS, BLOCK=fused.BLOCK)
    signature = {name: word for name in ("first", "count", "start", "stop", "seed", "index", "step_lo", "step_hi")}
    signature = {"out": "*fp64", **signature, **{name: "constexpr" for name in consts}}
    kernel = triton.compile(ASTSource(fn=fused.draw, signature=signature, constexprs=consts),
                            target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": fusion})
    return kernel.asm["ptx"]


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
@pytest.mark.parametrize("word", ["i64", "i32"])
def test_the_compiled_kernel_rounds_as_the_unfused_draw_does(word):
    """The kernel's PTX (what the interpreter cannot show): no multiply-add contracted, IEEE division, nothing in
    float32, and each of counter_normal's constants as its exact float64 literal, in arithmetic and comparisons
    alike (Triton rounds a bare Python float to float32 in a comparison). With fusion left on, the same source
    does contract: the launch's enable_fp_fusion=False is what keeps the bits."""
    import re
    import struct

    ptx = _ptx(fusion=False, word=word)
    assert not re.search(r"\bfma\.\w+\.f64", ptx) and not re.search(r"\.f32\b|\b0f[0-9A-F]{8}\b", ptx)
    divisions = re.findall(r"\bdiv\.(\w+)\.f64", ptx)
    assert divisions and set(divisions) == {"rn"}
    floats = {name: v for name, v in fused._CONSTANTS.items() if isinstance(v, float) and v not in (0.5, 1.0, 2.0)}
    literal = lambda x: "0d" + struct.pack(">d", x).hex().upper()  # noqa: E731
    assert [name for name, v in floats.items() if literal(v) not in ptx and literal(-v) not in ptx] == []
    assert re.search(r"\bfma\.rn\.f64", _ptx(fusion=True, word=word))


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_every_launch_turns_fusion_off_and_passes_the_constants_the_ptx_was_checked_with(monkeypatch):
    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, args, kwargs))

    monkeypatch.setattr(fused, "draw", Kernel())
    fused.draw_into(torch.empty(7, dtype=torch.float64), 3, 10, 5, 2**40 + 9, 6)
    (grid, args, kwargs), = launches
    assert kwargs.pop("enable_fp_fusion") is False and kwargs.pop("BLOCK") == fused.BLOCK
    assert kwargs == fused._CONSTANTS
    assert args[1:] == (1, 4, 3, 10, 5, 6, 9, 2**8) and grid == (1,)  # blocks 1..4 hold elements 3..9


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_elements_past_the_kernels_int64_indices_are_drawn_by_the_passes_and_a_bad_out_is_refused(monkeypatch):
    class Unlaunchable:
        def __getitem__(self, grid):
            raise AssertionError("the kernel was launched past its element limit")

    monkeypatch.setattr(fused, "draw", Unlaunchable())
    shape, rows = (fused.ELEMENT_LIMIT + 8,), (fused.ELEMENT_LIMIT - 3, fused.ELEMENT_LIMIT + 3)
    got = fused.normals(shape, 4, 2**63 + 1, 9, rows=rows, fused=True)
    assert same_bits(got, cn.normals(shape, 4, 2**63 + 1, 9, rows=rows))
    bad = (torch.empty(6, dtype=torch.float32), torch.empty(12, dtype=torch.float64)[::2],
           torch.empty(5, dtype=torch.float64))
    for out in bad:
        with pytest.raises(ValueError, match="contiguous float64 tensor of 6 elements"):
            fused.draw_into(out, 10, 16, 1, 2, 3)
