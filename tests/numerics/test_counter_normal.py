"""pitcheck.numerics.counter_normal: Philox4x32-10 against Random123's published known answers, the torch
generator bit for bit against the numpy reference (tests/counter_normal_reference.py) over seeds, steps and
indices at their edges and odd shapes, row slices and pass sizes that change no bit, uniforms strictly
inside (0, 1), its log, sqrt, sin and cos within a few ulps of libm, the normals' distribution at fixed
seeds, determinism, refused arguments, and on CUDA the same bits as the CPU's."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from pitcheck.infra.errors import PitcheckError
from pitcheck.numerics import counter_normal as cn
from tests import counter_normal_reference as ref

MASK = 0xFFFFFFFF

# DEShawResearch/random123 tests/kat_vectors (lines 24-29 at 9545ff64): counter words, key words, output words
KAT = [
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (10, (MASK,) * 4, (MASK,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (10, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    (7, (0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    (7, (MASK,) * 4, (MASK,) * 2, (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (7, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
]

EDGE = [0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
CASES = [  # (shape, seed, step, index)
    ((5,), 0, 0, 0), ((1,), 0, 0, 0), ((0,), 1, 1, 1), ((), 7, 3, 2), ((2, 3), 1, 0, 0),
    ((17, 3), 1234, 5, 1), ((3, 5, 7), 2**32 - 1, 2**32 - 1, 2**32 - 1), ((9, 1), 2**32 - 1, 0, 0),
    ((64, 33), 42, 2**32, 3), ((11, 13), 5, 2**64 - 1, 2**32 - 1), ((1000,), 2**31, 2**63, 2**31 - 1),
    ((7, 7), 3, 2**32 + 5, 0), ((257, 129), 2**32 - 2, 123_456_789, 77),
] + [((6, 5), s, t, i) for s in EDGE[::2] for t in EDGE[1::2] for i in EDGE[::3]]


def bits(x) -> np.ndarray:
    x = x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return np.ascontiguousarray(x).view(np.int64)


def ulps(a, b) -> np.ndarray:
    """Distance in float64 ulps (the count of doubles between a and b; +0 and -0 count as one apart)."""
    def ordered(x):
        m = bits(x) & np.int64(0x7FFFFFFFFFFFFFFF)
        return np.where(bits(x) < 0, -m - 1, m)
    return np.abs(ordered(a) - ordered(b))


def words_tensor(*words):
    return torch.tensor([[w] for w in words], dtype=torch.int64)


@pytest.mark.parametrize("rounds, counter, key, expected", KAT)
def test_philox_known_answers(rounds, counter, key, expected):
    """Philox4x32-10 (the default rounds) and -7 (an odd count of rounds ends in the other row order)."""
    got = cn.philox4x32(words_tensor(*counter), key, *([] if rounds == 10 else [rounds]))[:, 0].tolist()
    assert [f"{w:08x}" for w in got] == [f"{w:08x}" for w in expected]
    got = [int(w[0]) for w in ref.philox4x32(*[[c] for c in counter], *key, rounds=rounds)]
    assert got == list(expected)


def test_philox_words_match_reference_over_counters_and_keys():
    """Random counters and keys, and blocks whose number crosses 2^32 (the counter's second word)."""
    rng = np.random.default_rng(5)
    c = rng.integers(0, 2**32, size=(4, 4099), dtype=np.uint64)
    for k0, k1 in [(0, 0), (MASK, MASK), (1, 2**31), (int(rng.integers(2**32)), int(rng.integers(2**32)))]:
        got = cn.philox4x32(torch.from_numpy(c.astype(np.int64)), (k0, k1)).numpy()
        assert np.array_equal(got, np.stack(ref.philox4x32(*c, k0, k1)).astype(np.int64))
    for first in (0, 2**32 - 3, 2**40 + 7):
        got = cn.block_words(first, 6, 9, 2**33 + 1, 4).numpy()
        assert np.array_equal(got, np.stack(ref.words(6, 9, 2**33 + 1, 4, first=first)).astype(np.int64))
    assert cn.block_words(2**32, 1, 0, 0, 0)[:2, 0].tolist() != cn.block_words(0, 1, 0, 0, 0)[:2, 0].tolist()


@pytest.mark.parametrize("shape, seed, step, index", CASES)
def test_normals_are_the_reference_bits(shape, seed, step, index):
    got = cn.normals(shape, seed, step, index)
    want = ref.normals(shape, seed, step, index)
    assert got.dtype == torch.float64 and tuple(got.shape) == shape
    assert np.array_equal(bits(got), bits(want))


def test_rows_are_the_same_rows_of_the_full_draw():
    for shape in [(9, 5), (8, 4), (7, 1), (6, 3, 3), (5,)]:
        full = bits(cn.normals(shape, 11, 2**32 + 1, 3))
        n = shape[0]
        for start in range(n + 1):
            for stop in range(start, n + 1):
                part = cn.normals(shape, 11, 2**32 + 1, 3, rows=slice(start, stop))
                assert tuple(part.shape) == (stop - start, *shape[1:])
                assert np.array_equal(bits(part), full[start:stop])
        assert np.array_equal(bits(cn.normals(shape, 11, 2**32 + 1, 3, rows=(1, n))), full[1:n])
        assert np.array_equal(bits(cn.normals(shape, 11, 2**32 + 1, 3, rows=slice(-2, None))), full[-2:])
    big = (4099, 33)  # several passes of the CPU's pass size, odd row width
    full = bits(cn.normals(big, 3, 4, 5))
    for rows in [slice(0, 1), slice(1, 2), slice(1000, 3001), slice(4098, 4099), slice(2047, 4099)]:
        assert np.array_equal(bits(cn.normals(big, 3, 4, 5, rows=rows)), full[rows])


def test_pass_size_changes_no_bit(monkeypatch):
    full = bits(cn.normals((41, 7), 2, 3, 4))
    for chunk in (1, 2, 3, 64):
        monkeypatch.setitem(cn.CHUNK_BLOCKS, "cpu", chunk)
        assert np.array_equal(bits(cn.normals((41, 7), 2, 3, 4)), full)
        assert np.array_equal(bits(cn.normals((41, 7), 2, 3, 4, rows=(5, 9))), full[5:9])


def test_thread_count_changes_no_bit():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bits(cn.normals((300, 257), 8, 9, 10))
        torch.set_num_threads(2)
        two = bits(cn.normals((300, 257), 8, 9, 10))
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(one, two)


def test_uniforms_are_strictly_inside_the_unit_interval():
    lo = cn.open_uniforms(words_tensor(0), words_tensor(0)).item()
    hi = cn.open_uniforms(words_tensor(MASK), words_tensor(MASK)).item()
    assert lo == 2.0 ** -53 and hi == 1.0 - 2.0 ** -53
    w = cn.block_words(0, 1 << 19, 1, 2, 3)
    for a, b in ((0, 1), (2, 3)):
        u = cn.open_uniforms(w[a], w[b]).numpy()
        assert u.min() > 0.0 and u.max() < 1.0
        k = u * 2.0 ** 53  # exact: an odd integer
        assert np.array_equal(k, np.floor(k)) and np.all(k % 2 == 1)
        assert np.array_equal(u, ref.uniforms(w[a].numpy().astype(np.uint64), w[b].numpy().astype(np.uint64)))
        assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_log_sqrt_sin_cos_are_within_ulps_of_libm():
    rng = np.random.default_rng(8)
    u = np.concatenate([rng.random(200_000), rng.random(1000) * 1e-12, 1 - rng.random(1000) * 1e-12,
                        [2.0 ** -53, 1 - 2.0 ** -53, 0.5, math.sqrt(0.5), np.nextafter(math.sqrt(0.5), 1), 0.75]])
    u = u[u > 0]
    assert ulps(cn.log_unit(torch.from_numpy(u)), np.log(u)).max() <= 2
    a = -2.0 * np.log(u)
    a = a[a > 0]
    assert ulps(cn.sqrt_positive(torch.from_numpy(a)), np.sqrt(a)).max() <= 1
    n = rng.integers(0, 2**53, size=3000) | 1
    n = np.concatenate([n, [1, 3, 2**50 - 1, 2**50 + 1, 2**51 - 1, 2**51 + 1, 2**52 - 1, 2**52 + 1, 2**53 - 1]])
    cos, sin = cn.cos_sin_turns(torch.from_numpy(n))
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):  # the exact angle, 2 pi n / 2^53
        turns = [2 * mpmath.pi * int(k) / 2**53 for k in n]
        true_cos = np.array([float(mpmath.cos(t)) for t in turns])
        true_sin = np.array([float(mpmath.sin(t)) for t in turns])
    assert ulps(cos, true_cos).max() <= 2 and ulps(sin, true_sin).max() <= 2
    # in the first octant the polynomials themselves, relative to libm on the same angle
    x = torch.from_numpy(rng.random(200_000) * (np.pi / 4))
    z = x * x
    s = x + x * z * cn._horner(z, cn.SIN_COEFFS)
    c = z * cn._horner(z, cn.COS_COEFFS) + 1.0
    assert ulps(s, np.sin(x.numpy())).max() <= 2 and ulps(c, np.cos(x.numpy())).max() <= 2


# fixed seeds: a correct generator gives |mean| < 4 sigma, |var - 1| < 4 sigma, KS p > 1e-3, the pairs of a
# block uncorrelated and their squares too (Box-Muller's two outputs are independent), no value repeated
@pytest.mark.parametrize("seed, step, index", [(0, 0, 0), (2**32 - 1, 2**63 + 5, 12), (20_240_601, 17, 2**32 - 1)])
def test_normals_distribution_at_fixed_seeds(seed, step, index):
    n = 1 << 20
    z = cn.normals((n,), seed, step, index).numpy()
    assert abs(z.mean()) < 4 / math.sqrt(n)
    assert abs(z.var() - 1) < 4 * math.sqrt(2 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    even, odd = z[0::2], z[1::2]
    assert abs(np.corrcoef(even, odd)[0, 1]) < 4 / math.sqrt(n / 2)
    assert abs(np.corrcoef(even ** 2, odd ** 2)[0, 1]) < 4 / math.sqrt(n / 2)
    assert abs(np.corrcoef(z[:-2], z[2:])[0, 1]) < 4 / math.sqrt(n)
    assert len(np.unique(z)) == n
    assert abs(stats.kurtosis(z)) < 4 * math.sqrt(24 / n)


def test_same_call_same_bits_and_different_streams_differ():
    shape = (33, 17)
    base = bits(cn.normals(shape, 5, 6, 7))
    assert np.array_equal(bits(cn.normals(shape, 5, 6, 7)), base)
    others = [(6, 6, 7), (5, 7, 7), (5, 6, 8), (7, 6, 5), (5, 6 + 2**32, 7), (5 + 2**31, 6, 7), (0, 0, 0)]
    draws = [base] + [bits(cn.normals(shape, *key)) for key in others]
    for i in range(len(draws)):
        for j in range(i + 1, len(draws)):
            assert np.mean(draws[i] == draws[j]) < 0.01


def test_numpy_integers_are_taken():
    want = bits(cn.normals((3, 4), 1, 2, 3))
    got = cn.normals((np.int64(3), np.int32(4)), np.uint32(1), np.uint64(2), np.int16(3))
    assert np.array_equal(bits(got), want)


@pytest.mark.parametrize("kwargs, word", [
    (dict(seed=-1), "seed"), (dict(seed=2**32), "seed"), (dict(index=2**32), "index"), (dict(index=-5), "index"),
    (dict(step=2**64), "step"), (dict(step=-1), "step"), (dict(seed=True), "seed"), (dict(seed=1.0), "seed"),
    (dict(step="3"), "step"), (dict(shape=(3, -1)), "shape"), (dict(shape=(2.5,)), "shape"),
    (dict(rows=slice(0, 4, 2)), "rows"), (dict(rows=[0, 1]), "rows"), (dict(shape=(), rows=(0, 1)), "rows"),
])
def test_refused_arguments_are_one_line_errors(kwargs, word):
    args = dict(shape=(4, 3), seed=1, step=2, index=3) | kwargs
    shape = args.pop("shape")
    with pytest.raises(PitcheckError) as err:
        cn.normals(shape, **args)
    assert word in str(err.value) and "\n" not in str(err.value)


CUDA_ULPS = 4  # the acceptance bound for the normals' CUDA-CPU distance


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draw_is_the_cpu_draw():
    """On CUDA the Philox words and uniforms are the CPU's bits, and every normal is within CUDA_ULPS = 4
    float64 ulps of the CPU's: the acceptance figure to check on a GPU. By construction (only integer
    operations, exact conversions and single IEEE-rounded +, -, *, /, each its own kernel) the normals are
    expected to be bit-identical too; the bound leaves room for a compiler fusing a multiply and an add."""
    shape, key = (2049, 65), (3, 2**32 + 7, 11)
    for first in (0, 2**32 - 5):
        cpu = cn.block_words(first, 10_001, *key)
        gpu = cn.block_words(first, 10_001, *key, device="cuda")
        assert torch.equal(gpu.cpu(), cpu)
        assert np.array_equal(bits(cn.open_uniforms(gpu[0], gpu[1])), bits(cn.open_uniforms(cpu[0], cpu[1])))
    cpu = cn.normals(shape, *key)
    gpu = cn.normals(shape, *key, device="cuda")
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float64
    assert ulps(gpu, cpu).max() <= CUDA_ULPS
    rows = cn.normals(shape, *key, device="cuda", rows=(100, 1001))
    assert ulps(rows, cpu[100:1001]).max() <= CUDA_ULPS
