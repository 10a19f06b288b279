"""The clients' pilot fits (:func:`skfedgp.federated.pilot_fit`).

Several starting lengthscales, the best marginal likelihood kept, and the
booking of their messages.
"""

import contextlib
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from skfedgp import FederatedHierarchicalGPRegressor, SharedPartsOffWarning
from skfedgp import federated as fed


def _rough_series(seed, n=200, span=120.0, ell=0.6):
    """A rough GP-like series (lengthscale ``ell``) on a slow trend, noise sd 0.3."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, span, n))
    w = rng.normal(0, 1 / ell, 300)
    b = rng.uniform(0, 2 * np.pi, 300)
    f = np.sqrt(2 / 300) * np.cos(np.outer(x, w) + b).sum(1) + np.sin(x / 20)
    y = f + 0.3 * rng.standard_normal(n)
    return (x / span)[:, None], (y - y.mean()) / y.std(), span


@pytest.mark.parametrize("seed", [3, 7])
def test_pilot_reaches_the_rough_optimum(seed, monkeypatch):
    """From sqrt(d) alone these fits end in the smooth-trend optimum; with the
    finer starts the pilot finds the series' lengthscale (0.6)."""
    X, y, span = _rough_series(seed)
    ell = fed.pilot_fit(X, y, 0).lengthscale[0] * span
    assert 0.3 < ell < 1.5
    monkeypatch.setattr(fed, "PILOT_MULTI_START_POINTS", 10**9)  # one start only
    assert fed.pilot_fit(X, y, 0).lengthscale[0] * span > 4


def test_pilot_keeps_the_best_start_in_any_order(monkeypatch):
    """The kept fit is the best one, not the first or the last start's."""
    X, y, span = _rough_series(3)
    real = fed.pilot_starts
    for order in (lambda s: s[::-1], lambda s: np.roll(s, 1)):
        monkeypatch.setattr(fed, "pilot_starts", lambda X, o=order: o(real(X)))
        assert 0.3 < fed.pilot_fit(X, y, 0).lengthscale[0] * span < 1.5
    # the coarse start alone, wherever it stands, reaches the smooth optimum
    monkeypatch.setattr(fed, "pilot_starts", lambda X: real(X)[:1])
    assert fed.pilot_fit(X, y, 0).lengthscale[0] * span > 4


def test_a_failing_start_is_skipped(monkeypatch):
    """One start whose fit raises is skipped; all failing raises."""
    X, y, span = _rough_series(3)
    real_fit = fed._pilot_gp

    def fit(X, y, variance, lengthscale, *args, **kwargs):
        if np.ravel(lengthscale)[0] == 1.0:  # the coarse start
            raise np.linalg.LinAlgError("injected")
        return real_fit(X, y, variance, lengthscale, *args, **kwargs)

    monkeypatch.setattr(fed, "_pilot_gp", fit)
    assert 0.3 < fed.pilot_fit(X, y, 0).lengthscale[0] * span < 1.5
    monkeypatch.setattr(fed, "pilot_starts", lambda X: np.array([1.0]))
    with pytest.raises(np.linalg.LinAlgError, match="injected"):
        fed.pilot_fit(X, y, 0)


def test_pilot_keeps_the_better_marginal_likelihood():
    """The kept fit has a log marginal likelihood at least that of every start."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    X, y, _ = _rough_series(3)
    p = fed.pilot_fit(X, y, 0)
    Xs = (X - X.mean(0)) / X.std(0)

    def lml(ell, var, noise):
        k = ConstantKernel(var, "fixed") * RBF(ell, "fixed") + WhiteKernel(noise, "fixed")
        gp = GaussianProcessRegressor(k, optimizer=None).fit(Xs, y - y.mean())
        return gp.log_marginal_likelihood_value_

    kept = lml(p.lengthscale[0] / X.std(0)[0], p.variance, p.noise_variance)
    for start in fed.pilot_starts(Xs):
        v = float(np.var(y))
        k = (ConstantKernel(v, (1e-6 * v, 1e3 * v)) * RBF(start, (1e-3, 1e3))
             + WhiteKernel(0.1 * v, (1e-6 * v, 10.0 * v)))
        gp = GaussianProcessRegressor(k).fit(Xs, y - y.mean())
        assert kept >= gp.log_marginal_likelihood_value_ - 1e-6


def test_pilot_starts():
    grid = np.linspace(-1.7, 1.7, 256)[:, None]  # spacing 0.0133
    s = fed.pilot_starts(grid)
    assert s.size == fed.PILOT_MAX_STARTS
    np.testing.assert_allclose([s[0], s[-1]], [1.0, 3.4 / 255])
    assert np.all(np.diff(s) < 0)
    # high dimension, few points: the nearest neighbour is not much closer
    # than a typical pair: sqrt(d), a finer and a much coarser start
    X = np.random.default_rng(0).normal(size=(40, 8))
    np.testing.assert_allclose(fed.pilot_starts(X), np.sqrt(8) * np.array([1.0, 1 / 3, 10.0]))
    # equal inputs, or one point: one start; repeated inputs are skipped
    np.testing.assert_array_equal(fed.pilot_starts(np.zeros((5, 2))), [np.sqrt(2)])
    np.testing.assert_array_equal(fed.pilot_starts(np.zeros((1, 1))), [1.0])
    rep = np.repeat(grid, 3, axis=0)
    np.testing.assert_allclose(fed.pilot_starts(rep), s)
    # near-duplicates do not push the finest start below PILOT_MIN_START
    jitter = grid + 1e-9 * np.random.default_rng(1).standard_normal(grid.shape)
    near = fed.pilot_starts(np.vstack([grid, jitter]))
    assert near[-1] == fed.PILOT_MIN_START
    np.testing.assert_allclose(near, np.geomspace(1.0, fed.PILOT_MIN_START, near.size))


def test_small_client_pilot_starts_once(monkeypatch):
    """Below PILOT_MULTI_START_POINTS only sqrt(d) is tried (a handful of points)."""
    calls = []
    real = fed.pilot_starts
    monkeypatch.setattr(fed, "pilot_starts", lambda X: calls.append(len(X)) or real(X))
    X, y, _ = _rough_series(3, n=fed.PILOT_MULTI_START_POINTS - 1)
    fed.pilot_fit(X, y, 0)
    assert calls == []
    X, y, _ = _rough_series(3, n=fed.PILOT_MULTI_START_POINTS)
    fed.pilot_fit(X, y, 0)
    assert calls == [fed.PILOT_MULTI_START_POINTS]


def test_a_non_finite_pilot_reply_is_booked(monkeypatch):
    """A pilot reply dropped as non-finite still came over the wire: the
    set-up's upload counts it, and the retried client's fit is unchanged."""
    from skfedgp import FederatedHierarchicalGPRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (160, 1))
    g = np.repeat(np.arange(4), 40)
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=160)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1).fit(X, y, g)
        orig = fed.StructuredClient.pilot
        sent = []

        def pilot(self, random_state):
            p = orig(self, random_state)
            if self.client_id == 0 and not sent:  # the first reply only
                p = fed.PilotSummary(np.full_like(p.lengthscale, np.nan), p.variance,
                                     p.noise_variance)
                sent.append(fed.message_nbytes(p))
            return p

        monkeypatch.setattr(fed.StructuredClient, "pilot", pilot)
        est = FederatedHierarchicalGPRegressor(random_state=0, n_rounds=1).fit(X, y, g)
    assert [f[:3] for f in est.failed_clients_] == [(0, 0, "pilot")]
    assert est.elbo_history_ == ref.elbo_history_
    assert (est.communication_[0]["bytes_up"]
            == ref.communication_[0]["bytes_up"] + sent[0])


def _ten_inputs_two_relevant(seed, n, K=4):
    rng = np.random.default_rng(seed)
    off = rng.normal(0, 0.5, K)

    def make(m):
        X = rng.uniform(-2, 2, (K * m, 10))
        g = np.repeat(np.arange(K), m)
        f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] * np.cos(1.5 * X[:, 1])
        return X, f + off[g] + rng.normal(0, 0.1, K * m), g

    return make(n), make(50)


@pytest.mark.slow
def test_high_dimensional_pilots_find_the_signal_and_keep_the_shared_part():
    """10 inputs of which 2 matter, 4 clients of 200 points sharing one
    function (seed 4): started at sqrt(d) alone every pilot ended with noise
    variance 0.53-0.60 of its targets' (every lengthscale about 0.3), the
    fit switched the shared parts off (SharedPartsOffWarning) and held-out
    RMSE was 0.746 against 0.104 for an exact GP. With the finer and coarser
    starts every pilot finds the signal (noise about 0.015) and the fit
    matches the exact GP."""
    (X, y, g), (Xt, yt, gt) = _ten_inputs_two_relevant(4, 200)
    for c in range(4):
        Xi, yi = X[g == c], y[g == c]
        p = fed.pilot_fit(Xi, (yi - yi.mean()) / yi.std(), 0)
        assert p.noise_variance < 0.05, (c, p.noise_variance)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedPartsOffWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=4).fit(X, y, groups=g)
    rmse = np.sqrt(np.mean((est.predict(Xt, gt) - yt) ** 2))
    assert rmse < 0.13, rmse


def _fast_in_time(seed=1, n=120, d=6):
    """Time (uniform on [0, 21]) with a rough GP-like signal (lengthscale 0.3)
    beside 5 standard-normal inputs, one of which (column 2) has a smooth
    effect; noise sd 0.3 (about 0.2 of the targets' spread). Standardised y."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[:, 0] = rng.uniform(0, 21, n)
    w, b = rng.normal(0, 1 / 0.3, 300), rng.uniform(0, 2 * np.pi, 300)
    f = np.sqrt(2 / 300) * np.cos(np.outer(X[:, 0], w) + b).sum(1) + 0.7 * np.tanh(X[:, 2])
    y = f + 0.3 * rng.normal(size=n)
    return X, (y - y.mean()) / y.std()


def test_a_fast_input_among_slow_ones_is_found_from_its_own_lengthscale(monkeypatch):
    """Every isotropic start ends with time smooth (lengthscale 34) and 0.69
    of the variance called noise, 43 nats below the fit started from each
    input's own lengthscale, which finds time's 0.3 (the Beijing stations'
    case: hourly PM2.5 beside weather covariates)."""
    X, y = _fast_in_time()
    p = fed.pilot_fit(X, y, 0)
    assert 0.2 < p.lengthscale[0] < 0.6 and p.noise_variance < 0.1, p
    monkeypatch.setattr(fed, "PILOT_MARGINAL_START", False)
    p = fed.pilot_fit(X, y, 0)
    assert p.lengthscale[0] > 5 and p.noise_variance > 0.5, p


def test_marginal_lengthscales():
    """Each input's own lengthscale; an input that explains nothing alone (its
    best one-input kernel is white noise at its values), or that is constant,
    starts flat at PILOT_MAX_MARGINAL_START."""
    X, y = _fast_in_time()
    X[:, 4] = 3.0  # a constant column
    Xs = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    ell = fed.marginal_lengthscales(Xs, y - y.mean())
    assert ell.shape == (6,)
    assert 0.02 < ell[0] < 0.1  # 0.3 of time's spread of about 6
    assert ell[4] == fed.PILOT_MAX_MARGINAL_START
    # inputs without effect: flat (column 2's weak monotone effect is smooth
    # or flat, about at the BIC margin)
    np.testing.assert_array_equal(ell[[1, 3, 5]], fed.PILOT_MAX_MARGINAL_START)
    assert ell[2] > 0.5
    # alone, a column of noise interpolates its targets with a short kernel
    # (white at its values), never counted as a fast input
    col = Xs[:, [1]]
    assert not fed.white_at_inputs(col, [1.0]) and fed.white_at_inputs(col, [1e-3])
    # a binary column (isotropic starts 10, 1 and 1/3) is fitted from 10 and 1/3
    calls = []
    fit = fed._pilot_gp

    def spy(X, y, variance, lengthscale, *args, **kwargs):
        calls.append(float(lengthscale))
        return fit(X, y, variance, lengthscale, *args, **kwargs)

    binary = (np.arange(120) % 2)[:, None] * 2.0 - 1.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fed, "_pilot_gp", spy)
        fed.marginal_lengthscales(binary, y - y.mean())
    assert calls == [10.0, 1.0 / 3.0]
    assert np.all((ell >= fed.PILOT_MIN_START) & (ell <= fed.PILOT_MAX_MARGINAL_START))


def test_resolution_floor():
    """A quarter of the smallest gap between distinct values, rounded down to
    a power of two (it gives away no input); 0 for a constant input; repeated
    values do not count as a gap."""
    X = np.c_[[0.0, 2.0, 2.0, 5.0, 1.0], [3.0] * 5, [0.1, 0.15, 0.9, 0.5, 0.3]]
    np.testing.assert_allclose(fed.resolution_floor(X), [0.25, 0.0, 2.0**-7])
    # at or below it two neighbouring values are (almost) independent
    assert np.exp(-0.5 * fed.RESOLUTION_FACTOR ** 2) < 1e-3
    # an input between the box's ends cannot be read back from the floor
    a = np.c_[[0.0, np.pi, 10.0]]
    assert fed.resolution_floor(a)[0] == 0.5


def _integer_inputs(seed, n=30, n_clients=5):
    """x in {0, ..., 9}, y = sin(2.5 x) + noise sd 0.3: a function that is
    rough at the grid's spacing, shared by every client."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 10, size=(n_clients * n, 1)).astype(float)
    g = np.repeat(np.arange(n_clients), n)
    y = np.sin(2.5 * X[:, 0]) + 0.3 * rng.standard_normal(n_clients * n)
    Xt = rng.integers(0, 10, size=(500, 1)).astype(float)
    gt = rng.integers(0, n_clients, 500)
    yt = np.sin(2.5 * Xt[:, 0]) + 0.3 * rng.standard_normal(500)
    return (X, y, g), (Xt, yt, gt)


def test_pilot_on_a_grid_stops_at_the_resolution():
    """On integer inputs the marginal likelihood is flat below a fraction of
    the unit gap: the pilot used to drift to its bound (0.003 units)."""
    (X, y, g), _ = _integer_inputs(0)
    Xs = X[g == 0] / 9.0
    p = fed.pilot_fit(Xs, (y[g == 0] - y[g == 0].mean()) / y[g == 0].std(), 0)
    assert p.lengthscale[0] >= fed.resolution_floor(Xs)[0] > 0.125 / 9.0


@pytest.mark.parametrize("seed", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_inputs_on_a_grid_match_the_exact_gp(seed):
    """Pilots at their bound (0.003 units, from the flat likelihood below
    the gap) made the set-up grow the global design to 75 points and learn
    it; the first round then sent the lengthscale to its floor and called
    the function noise: held-out RMSE 0.71 and 0.48 against 0.30 and 0.32
    for scikit-learn's exact GP."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    (X, y, g), (Xt, yt, gt) = _integer_inputs(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(random_state=0).fit(X, y, groups=g)
    mean, std = est.predict(Xt, gt, return_std=True)
    exact = GaussianProcessRegressor(ConstantKernel() * RBF() + WhiteKernel(), normalize_y=True,
                                     n_restarts_optimizer=3, random_state=0).fit(X, y)
    rmse_exact = np.sqrt(np.mean((exact.predict(Xt) - yt) ** 2))
    assert np.sqrt(np.mean((mean - yt) ** 2)) <= 1.05 * rmse_exact
    assert np.mean(np.abs(mean - yt) > 3 * std) <= 0.02


def test_grid_floor_accepts_a_shorter_given_lengthscale_and_does_not_warn():
    """A given local_lengthscale below the resolution floor starts at the
    floor (it used to raise "outside the optimiser's range"), and local
    lengthscales that end at the floor, where the data cannot tell them from
    shorter ones, raise no ConvergenceWarning."""
    rng = np.random.default_rng(2)
    X = rng.integers(0, 10, (150, 1)).astype(float)
    g = np.repeat(np.arange(5), 30)
    # independent values at the grid points: the data say "shorter than the gap"
    y = rng.standard_normal(10)[X[:, 0].astype(int)] + 0.3 * rng.standard_normal(150)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(components=("local",), local_lengthscale=0.05,
                                               random_state=0).fit(X, y, groups=g)
    for c in est.clients_.values():
        ell = c.local_values()["lengthscale_l"]
        assert np.all(ell >= c._resolution * (1 - 1e-9))


def test_the_extra_run_of_a_fit_reuses_the_clients_pilots(monkeypatch):
    """``restart_from_global`` trains a second model on the same data, whose
    set-up asks every client for its pilot again: the exact GPs are fitted
    once per client (scikit-learn's fit is the set-up's main cost in many
    inputs), the second run still sends and books the uploads, and the fitted
    model is the one where every pilot is fitted again."""
    import skfedgp.regressor as reg

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (160, 2))
    g = np.repeat(np.arange(4), 40)
    y = np.sin(6 * X[:, 0]) + 0.3 * g * X[:, 1] + 0.1 * rng.normal(size=160)
    calls = []
    fitted = fed._pilot_fit

    def counting(*args):
        calls.append(1)
        return fitted(*args)

    monkeypatch.setattr(fed, "_pilot_fit", counting)
    kw = dict(random_state=0, restart_from_global=True, n_rounds=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = FederatedHierarchicalGPRegressor(**kw).fit(X, y, g)
        assert est.restarted_from_global_ is not None  # the second run was made
        assert len(calls) == 4
        assert fed._PILOT_MEMO is None  # nothing is left once fit returns
        monkeypatch.setattr(reg, "pilot_memo", contextlib.nullcontext)
        del calls[:]
        ref = FederatedHierarchicalGPRegressor(**kw).fit(X, y, g)
    # three runs: the full model, the global-only model, and the full model
    # restarted from the latter's lengthscales
    assert len(calls) == 12
    assert est.elbo_history_ == ref.elbo_history_
    assert est.communication_ == ref.communication_
    np.testing.assert_array_equal(est.predict(X, g), ref.predict(X, g))


def _sklearn_pilot(X, y, v, ell, noise_share, bounds=(1e-3, 1e3)):
    """The same fit with scikit-learn's GaussianProcessRegressor (the reference)."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    k = (ConstantKernel(v, (1e-6 * v, 1e3 * v)) * RBF(ell, bounds)
         + WhiteKernel(noise_share * v, (1e-6 * v, 10.0 * v)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return GaussianProcessRegressor(k).fit(X, y)


@pytest.mark.parametrize("n, d, start, bounds", [
    (120, 1, 0.3, (1e-3, 1e3)),          # isotropic, one input
    (150, 3, "ard", (1e-3, 1e3)),        # ARD from a vector start
    (150, 3, 1.5, (1e-3, 1e3)),          # isotropic in three inputs
    (60, 2, "ard", "fixed"),             # lengthscales held
])
def test_pilot_gp_reproduces_scikit_learns_fit(n, d, start, bounds):
    """Same objective, bounds and optimizer as scikit-learn's
    GaussianProcessRegressor(ConstantKernel * RBF + WhiteKernel): the same
    optimum (log marginal likelihood and hyperparameters)."""
    rng = np.random.default_rng(n + d)
    X = rng.normal(size=(n, d))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, -1] + 0.1 * rng.normal(size=n)
    y -= y.mean()
    v = float(np.var(y))
    ell = np.linspace(0.5, 2.0, d) if start == "ard" else start
    ours = fed._pilot_gp(X, y, v, ell, 0.1, lengthscale_bounds=bounds)
    ref = _sklearn_pilot(X, y, v, ell, 0.1, bounds)
    assert ours.log_marginal_likelihood == pytest.approx(ref.log_marginal_likelihood_value_,
                                                         abs=1e-5)
    k = ref.kernel_
    np.testing.assert_allclose(ours.lengthscale, k.k1.k2.length_scale, rtol=1e-3)
    assert np.ndim(ours.lengthscale) == np.ndim(k.k1.k2.length_scale)
    assert ours.variance == pytest.approx(k.k1.k1.constant_value, rel=1e-3)
    assert ours.noise_variance == pytest.approx(k.k2.noise_level, rel=1e-3)
    np.testing.assert_allclose(ours.L, ref.L_, atol=1e-8)


@pytest.mark.parametrize("iso, fixed", [(False, False), (True, False), (False, True)])
def test_pilot_objective_gradient_matches_finite_differences(iso, fixed):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 3))
    y = np.cos(X[:, 0]) + 0.2 * rng.normal(size=30)
    ell = np.array([0.7, 1.3, 2.0])
    theta = [np.log(0.8)] + ([] if fixed else ([np.log(0.9)] if iso else list(np.log(ell))))
    theta = np.array(theta + [np.log(0.05)])
    args = (X, y, iso, ell if fixed else None)
    _, g = fed._pilot_objective(theta, *args)
    h = 1e-6
    fd = [(fed._pilot_objective(theta + h * e, *args)[0]
           - fed._pilot_objective(theta - h * e, *args)[0]) / (2 * h) for e in np.eye(theta.size)]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


def test_pilot_gp_rejects_non_finite_values():
    X = np.zeros((5, 1))
    X[2] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        fed._pilot_gp(X, np.arange(5.0), 1.0, 1.0, 0.1)
