"""The metrics of torch tensors computed where they live (pitcheck.numerics.device_metrics): the numpy form's
values to within float64 summation order, the same refusals, and no V x D table read to the host."""
import numpy as np
import pytest
import torch

from pitcheck.infra.errors import PitcheckError
from pitcheck.model.engine import Engine, StepSettings
from pitcheck.model.heads import HEAD_TYPES
from pitcheck.numerics import device_metrics, metrics
from pitcheck.numerics.formats import FORMATS
from pitcheck.numerics.policy import get_policy

# float64 metrics of the same float64 operands, in other summation orders (torch's BLAS, numpy's): each value
# is a residual r of O(1)-normed operands, D x D entries that each sum V products: a rounding error of V u64 at
# worst, about sqrt(V) u64 as the errors accumulate in practice, D^2 of them in a Frobenius norm. Where the state
# is coarser than float64 that is ~3e-10 of r at most here (penrose_4, whose B_perp is a difference), and RTOL
# leaves room; where the state is float64 the residuals themselves are at that floor and only the absolute bound
# 16 sqrt(V) D u64 holds (a ratio in units of u: over u), and the trisolve metrics, whose yardstick is then the
# host's extended one on the same rows, are equal.
# The trisolve yardstick is float64 on the device (extended on the host) for u >= 16 u64: its reference rows
# carry ~cond(T) u64, a few 1e-9 of the forward error measured here
RTOL = 1e-7
RATIOS = {"orthonormality_ratio": 1.0, "trisolve_forward_ratio": 1.0, "trisolve_backward_ratio": 1.0}
NUMERIC = [k for k in ("orthonormality", "orthonormality_ratio", "cond_L", "cond_T", "min_diag_L", "breakdown_margin",
                       "trisolve_forward", "trisolve_forward_ratio", "trisolve_backward", "trisolve_backward_ratio",
                       "pinv_drift", "penrose", "penrose_1", "penrose_2", "penrose_3", "penrose_4", "pinv_error")]
HEAD_KEYS = NUMERIC[-7:]
# the same code on a GPU where there is one (cuBLAS's and cuSOLVER's float64, against numpy's)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


def _state(V, D, fmt, seed=0, noise=1e-5):
    """Z near the manifold, L well conditioned, E = Z T^{-1} rounded: all held exactly in fmt."""
    rng = np.random.default_rng(seed)
    dtype = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}[fmt]
    held = lambda x: torch.tensor(x).to(dtype)  # noqa: E731
    Z = held(np.linalg.qr(rng.standard_normal((V, D)))[0] + noise * rng.standard_normal((V, D)))
    A = 0.1 * rng.standard_normal((D, D))
    L = held(np.tril(A, -1) + np.diag(1.0 + np.abs(np.diag(A))))
    T = L.double() @ L.double().T
    E = held(torch.linalg.solve(T, Z.double().T).T.numpy())
    return Z, L, E


def _host(x):
    return x.double().cpu().numpy()


def _agree(got: dict, want: dict, keys=NUMERIC, dim: int = 32, u: float = 1.0, vocab: int = 2048):
    """got and want within RTOL, or within the float64 floor 16 sqrt(V) D u64 (over u for a ratio to u)."""
    floor = 16 * vocab**0.5 * dim * 2.0**-53
    for k in keys:
        assert got[k] == pytest.approx(want[k], rel=RTOL, abs=floor / u if k in RATIOS else floor), k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "fp64", "bf16"])
@pytest.mark.parametrize("shape", [(2048, 32), (300, 8)])
def test_interface_metrics_on_the_device_are_the_host_forms(fmt, shape, device):
    Z, L, E = _state(*shape, fmt)
    u = FORMATS[fmt].u
    want = metrics.interface_metrics(_host(Z), _host(L), _host(E), u, factor_u=FORMATS["fp32"].u)
    got = device_metrics.interface_metrics(Z.to(device), L.to(device), E.to(device), u, factor_u=FORMATS["fp32"].u)
    _agree(got, want, dim=shape[1], u=u, vocab=shape[0])
    assert got["trisolve_resolved"] == want["trisolve_resolved"]
    if fmt == "fp64":  # the same extended-precision yardstick on the same rows: the same bits
        assert all(got[k] == want[k] for k in NUMERIC if k.startswith("trisolve"))


@pytest.mark.parametrize("device", DEVICES)
def test_a_head_of_its_own_and_the_householder_branch_agree_too(device):
    """An untied B, and an E conditioned past Cholesky QR's limit (the Householder QR runs on the device)."""
    Z, L, E = _state(1024, 16, "fp64")
    on = lambda x: x.to(device)  # noqa: E731
    rng = np.random.default_rng(1)
    B = (Z @ (L @ L.T)) + 1e-6 * torch.from_numpy(rng.standard_normal(Z.shape))
    want = metrics.head_metrics(_host(E), _host(B))
    _agree(device_metrics.head_metrics(on(E), on(B)), want, HEAD_KEYS, 16, vocab=1024)
    E_ill = E.clone()
    E_ill[:, 0] *= 1e-7  # cond(E) ~ 2e7 > CHOLQR2_MAX_COND
    assert metrics.condition_number(_host(E_ill)) > metrics.CHOLQR2_MAX_COND
    # B near E's pseudo-inverse: pinv_error (1e-11) is a residual that R's every entry moves
    Q, R = np.linalg.qr(_host(E_ill))
    B_ill = torch.from_numpy(Q @ np.linalg.inv(R).T + 1e-6 * rng.standard_normal(Q.shape))
    got, want = device_metrics.head_metrics(on(E_ill), on(B_ill)), metrics.head_metrics(_host(E_ill), _host(B_ill))
    assert 1e-12 < want["pinv_error"] < 1e-6
    # E^T B's entries carry rounding errors of about sqrt(V) u (|E|^T |B|)_ij (Higham and Mary's probabilistic
    # bound), 1e7 times the well-conditioned case's: which summation order a BLAS takes moves ||E^T B - I||_F
    # and P3's residual by up to that (1e-11 and 3e-12 seen on one CPU against a 9e-13 floor)
    from_gram = ("pinv_drift", "penrose_3")
    _agree(got, want, [k for k in HEAD_KEYS if k not in from_gram], 16, vocab=1024)
    rounding = 1024**0.5 * 2.0**-53 * np.linalg.norm(np.abs(_host(E_ill)).T @ np.abs(_host(B_ill)))
    for k in from_gram:
        assert rounding < 0.1 * want[k]  # the check still tells a wrong value from this one
        assert got[k] == pytest.approx(want[k], rel=RTOL, abs=rounding), k


@pytest.mark.parametrize("fmt,bits", [("fp32", 53), ("bf16", 53), ("fp64", metrics.EXTENDED_BITS)])
def test_the_trisolve_yardstick_is_float64_on_the_device_only_where_it_is_16_times_finer_than_u(fmt, bits):
    """fp32 and coarser: float64 solves where the rows live (the extended ones on the host cost 1.6 s a record
    at D = 512); float64 itself: extended precision, as the host form; the same values to within RTOL."""
    Z, L, E = _state(512, 16, fmt)
    u, ids = FORMATS[fmt].u, metrics.sample_ids(512, 256)
    work = device_metrics.TorchWork(Z)
    rows = [work.rows(x.double(), ids) for x in (Z, E)]
    exact, resid, got_bits = work.yardstick(rows[0], _host(L), rows[1], u)
    assert got_bits == bits and exact.shape == resid.shape == (len(ids), 16)
    want = metrics.extended_yardstick(*(r.numpy() for r in (rows[0],)), _host(L), rows[1].numpy())
    scale = np.abs(want[0].astype(np.float64)).max()
    assert np.abs(exact - want[0].astype(np.float64)).max() <= 64 * 2.0**-53 * scale
    got = device_metrics.interface_metrics(Z, L, E, u)
    _agree(got, metrics.interface_metrics(_host(Z), _host(L), _host(E), u), dim=16, u=u, vocab=512)
    assert got["trisolve_resolved"] is (fmt != "fp64" or 2.0**-metrics.EXTENDED_BITS <= u / 16)


def test_the_device_form_sees_a_wrong_operand():
    """The comparison above can fail: an E off by a float32 rounding of T^{-1} moves the trisolve and head
    metrics far outside RTOL."""
    Z, L, E = _state(1024, 16, "fp64")
    want = metrics.interface_metrics(_host(Z), _host(L), _host(E), 2.0**-53)
    got = device_metrics.interface_metrics(Z, L, E.float().double(), 2.0**-53)
    with pytest.raises(AssertionError):
        _agree(got, want, ["trisolve_backward", "pinv_drift"], 16, vocab=1024)


@pytest.mark.parametrize("where,message", [("Z", "Z has non-finite"), ("E", "E has non-finite")])
def test_non_finite_tables_are_refused_as_the_host_form_refuses_them(where, message):
    Z, L, E = _state(256, 8, "fp32")
    arrays = {"Z": Z.clone(), "E": E.clone()}
    arrays[where][3, 1] = float("nan")
    with pytest.raises(PitcheckError, match=message):
        device_metrics.interface_metrics(arrays["Z"], L, arrays["E"], 2.0**-24)
    with pytest.raises(PitcheckError, match=message):
        metrics.interface_metrics(_host(arrays["Z"]), _host(L), _host(arrays["E"]), 2.0**-24)


def test_bad_arguments_are_refused_in_one_line():
    Z, L, E = _state(256, 8, "fp32")
    with pytest.raises(PitcheckError, match="shape mismatch"):
        device_metrics.interface_metrics(Z, L, E[:100], 2.0**-24)
    with pytest.raises(PitcheckError, match="lower triangular"):
        device_metrics.interface_metrics(Z, L.T, E, 2.0**-24)
    with pytest.raises(PitcheckError, match="unit roundoff"):
        device_metrics.interface_metrics(Z, L, E, 2.0)
    with pytest.raises(PitcheckError, match="2-D"):
        device_metrics.head_metrics(E[0], E[0])
    with pytest.raises(PitcheckError, match="real"):
        device_metrics.orthonormality(torch.zeros(4, 2, dtype=torch.complex64), 2.0**-24)


def test_arguments_off_the_device_or_not_tensors_are_refused():
    Z, L, E = _state(256, 8, "fp32")
    with pytest.raises(PitcheckError, match="one device"):
        device_metrics.interface_metrics(Z, L, E.to("meta"), 2.0**-24)
    with pytest.raises(PitcheckError, match="torch tensor"):
        device_metrics.head_metrics(E, _host(E))


def test_a_device_out_of_memory_is_measured_on_the_host(monkeypatch):
    """The device form's float64 copies may not fit beside a large model: a refusal, and the record is the
    host form's."""
    V, D = 512, 8
    Z0, L0, _ = _state(V, D, "fp64", noise=0.0)
    model = Engine("torch", get_policy("fp32"), StepSettings("qr", "sgd", 0.1), device="cpu")
    model.initialise(Z0.numpy(), L0.numpy())
    want = model.interface()

    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.5 GiB")

    monkeypatch.setattr(device_metrics.TorchWork, "gram", staticmethod(out_of_memory))
    with pytest.raises(PitcheckError, match="ran out of memory"):
        device_metrics.interface_metrics(model.model.Z, model.model.L, model.model.Z, 2.0**-24)
    got = model.interface()
    _agree(got, want, NUMERIC, D, model.policy.u, V)


def test_relative_distance_is_the_host_forms():
    Z, _, _ = _state(512, 8, "fp32")
    Zr = Z.double() + 1e-7
    want = np.linalg.norm(_host(Z) - _host(Zr)) / np.linalg.norm(_host(Zr))
    assert device_metrics.relative_distance(Z, Zr) == pytest.approx(want, rel=1e-12)


class _HostReads:
    """Every tensor read into numpy while it is active, by shape."""

    def __init__(self, monkeypatch):
        self.shapes = []
        numpy = torch.Tensor.numpy

        def recorded(t, *args, **kw):
            self.shapes.append(tuple(t.shape))
            return numpy(t, *args, **kw)

        monkeypatch.setattr(torch.Tensor, "numpy", recorded)

    def largest(self) -> int:
        """The most entries of one read."""
        return max((int(np.prod(s)) for s in self.shapes), default=0)


@pytest.mark.parametrize("head", ["pit", "tied", "untied"])
def test_a_torch_model_is_measured_without_reading_a_table_to_the_host(monkeypatch, head):
    """A record of a torch model and its distance from a torch float64 shadow read D x D matrices and the 256
    sampled rows, never the V x D tables (the host form reads Z, E and B whole); the row is the host form's."""
    V, D = 1024, 16
    Z0, L0, _ = _state(V, D, "fp64", noise=0.0)
    Z0, L0 = Z0.numpy(), L0.numpy()
    engines = [Engine("torch", get_policy(p), StepSettings("qr", "sgd", 0.1), device="cpu", head=HEAD_TYPES[head])
               for p in ("fp32", "fp64")]
    for eng in engines:
        eng.initialise(Z0, L0)
    model, shadow = engines
    reads = _HostReads(monkeypatch)
    row = model.interface()
    distances = model.distance(shadow)
    assert 0 < reads.largest() <= 256 * D  # a table, V x D or D x V, would be 1024 * D
    monkeypatch.undo()
    host = model.model._interface_on_host() if head != "pit" else None
    if head == "pit":
        Z, L = model.stored()
        B = Z @ (L @ L.T)
        host = metrics.interface_metrics(Z, L, model.embed_all(), model.policy.u,
                                         FORMATS[model.policy.factor].u, B=B)
    keys = [k for k in NUMERIC if k in host and np.isfinite(host[k])]
    assert "penrose" in keys and "orthonormality" in keys
    _agree(row, host, keys, D, model.policy.u, V)
    assert distances[0] > 0 and np.isfinite(distances[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp8-logits", "fp8-logits-block", "mxfp8-logits", "fp8-logits-delayed"])
def test_an_fp8_logits_head_is_measured_on_the_device_as_the_host_measures_it(monkeypatch, precision, device):
    """The FP8 logits GEMM's head W^T = q_w(Z) q_a(T)^T: its cast of Z and the product on the device, T's cast on the
    host (D x D); the row is the host form's, and no table is read. A delayed recipe's scales are the run's after
    a few steps (its history read from a copy: the record leaves the run's histories as they were)."""
    V, D = 1024, 32
    Z0, L0, _ = _state(V, D, "fp64", noise=0.0)
    eng = Engine("torch", get_policy(precision), StepSettings("qr", "adam", 1e-3), device=device)
    eng.initialise(Z0.numpy(), L0.numpy())
    for step in range(3):
        eng.step(eng.gradients(["gaussian"], 0, step, None), step)
    history = eng.quantisers.state_dict()  # the pending forwards observed, as a record observes them
    reads = _HostReads(monkeypatch)
    row = eng.interface()
    assert 0 < reads.largest() <= 256 * D
    monkeypatch.undo()
    after = eng.quantisers.state_dict()
    assert after.keys() == history.keys() and all(np.array_equal(after[k], history[k]) for k in after)
    Z, L = eng.stored()
    host = metrics.interface_metrics(Z, L, eng.embed_all(), eng.policy.u, FORMATS[eng.policy.factor].u,
                                     B=eng.quantisers.logits_head(Z, L), solve_u=eng.policy.solve_u)
    keys = [k for k in NUMERIC if np.isfinite(host[k])]
    assert {"pinv_drift", "penrose", "orthonormality"} <= set(keys)
    assert host["pinv_drift"] > 1e-3  # the FP8 head, not T: W E - I is the format's, far above fp32's
    # the solves are fp32's, whichever format the logits GEMM reads: their ratio is in fp32's u
    solves = [k for k in keys if k.startswith("trisolve_")]
    assert eng.policy.solve_u == FORMATS["fp32"].u < eng.policy.u and 0.01 < row["trisolve_forward_ratio"] < 30
    _agree(row, host, [k for k in keys if k not in solves], D, eng.policy.u, V)
    _agree(row, host, solves, D, eng.policy.solve_u, V)
