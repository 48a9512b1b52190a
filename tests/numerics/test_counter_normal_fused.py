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
    unfused = lambda *a, **k: cn.normals(*a, **k, fused=False)  # noqa: E731

    def one_bit_off(*a, **k):
        z = unfused(*a, **k)
        bits = z.view(torch.int64).clone()
        bits.view(-1)[-1] ^= 1
        return bits.view(torch.float64)

    assert fused.agrees("cpu", draw=unfused)
    assert not fused.agrees("cpu", draw=one_bit_off)


def test_the_cpu_draws_unfused_and_never_imports_the_kernel_check():
    fused._READY.clear()
    cn.normals((4, 4), 1, 2, 3)
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
    got = cn.normals(shape, seed, step, index, device="cuda", rows=rows, fused=True)
    assert same_bits(got, cn.normals(shape, seed, step, index, device="cuda", rows=rows, fused=False))
    assert same_bits(got, cn.normals(shape, seed, step, index, rows=rows))  # the CPU's draw


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and Triton")
def test_normals_on_cuda_picks_the_checked_kernel():
    fused._READY.clear()
    cn.normals((8, 8), 0, 0, 0, device="cuda")
    assert fused._READY == {"cuda:0": True} or fused._READY == {"cuda": True}


@pytest.mark.skipif(torch.cuda.is_available() or not HAS_TRITON, reason="needs Triton without CUDA (its interpreter)")
def test_the_kernel_under_triton_s_interpreter_is_the_unfused_draw_bit_for_bit():
    script = textwrap.dedent(f"""
        import torch
        from pitcheck.numerics import counter_normal as cn
        for shape, seed, step, index, rows in {CASES!r}:
            a = cn.normals(shape, seed, step, index, rows=rows, fused=True)
            b = cn.normals(shape, seed, step, index, rows=rows, fused=False)
            assert torch.equal(a.view(torch.int64), b.view(torch.int64)), (shape, seed, step, index, rows)
        from pitcheck.numerics import counter_normal_fused as fused
        assert fused.agrees("cpu")  # normals' cases and blocks past 2^32
        print("same bits")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-2000:]
