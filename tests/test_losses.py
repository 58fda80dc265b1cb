"""Numbers for the per-token losses (docs/losses.md): hand-computed vectors, gradients, clip intervals,
IPO vs IcePop masks, NaN handling, custom losses and config errors.

Expected values are computed here with plain python `math`, never with the code under test. The
shared test vector is docs/losses.md (Test vector).
"""

import math
import sys
import textwrap

import pytest
import torch
from vf.trainer import losses
from vf.trainer.losses import LossConfigError

# the shared test vector (docs/losses.md)
LP = [-0.1, -1.0, -2.0, -0.5, -3.0]
MU = [-0.2, -1.0, -1.2, -1.6, -1.0]
RHO_TABLE = [1.1052, 1.0, 0.4493, 3.0042, 0.1353]
DP_TABLE = [0.0861, 0.0, 0.1659, 0.4046, 0.3181]


def run(name, lp, mu, adv, mask=None, **params):
    """Call loss `name`; return (output, d loss / d logπ as a list)."""
    logp = torch.tensor(lp, dtype=torch.float32, requires_grad=True)
    mask = torch.ones(len(lp), dtype=torch.bool) if mask is None else torch.tensor(mask)
    out = losses.get(name)(logp, torch.tensor(mu), torch.tensor(adv, dtype=torch.float32), mask, **params)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad.tolist()


def close(a, b, tol=1e-5):
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b):
        assert math.isclose(x, y, rel_tol=tol, abs_tol=tol), (a, b)


def ratios(lp, mu):
    return [math.exp(a - b) for a, b in zip(lp, mu)]


# --- the shared vector ---------------------------------------------------------------------------


def test_shared_vector_derived_quantities_and_metrics():
    r = ratios(LP, MU)
    close(r, RHO_TABLE, tol=1e-4)
    dp = [abs(math.exp(a) - math.exp(b)) for a, b in zip(LP, MU)]
    close(dp, DP_TABLE, tol=1e-4)
    out, _ = run("ipo", LP, MU, [1.0] * 5)
    m = out.metrics
    assert math.isclose(m["ratio_min"], min(r), rel_tol=1e-6)
    assert math.isclose(m["ratio_max"], max(r), rel_tol=1e-6)
    assert math.isclose(m["ratio_mean"], sum(r) / 5, rel_tol=1e-6)
    assert math.isclose(m["mean_abs_prob_diff"], sum(dp) / 5, rel_tol=1e-5)
    k3 = [x - math.log(x) - 1 for x in r]
    assert math.isclose(m["mismatch_kl"], sum(k3) / 5, rel_tol=1e-5)
    assert m["num_loss_tokens"] == 5 and m["num_invalid_tokens"] == 0


def test_ipo_and_icepop_disagree_on_tokens_3_and_5():
    ipo, g_ipo = run("ipo", LP, MU, [1.0] * 5)
    ice, g_ice = run("icepop", LP, MU, [1.0] * 5)
    assert ipo.token_mask.tolist() == [True, True, True, False, False]  # |Δp| ≤ 0.3
    assert ice.token_mask.tolist() == [True, True, False, True, False]  # 0.5 ≤ r ≤ 5
    narrow, _ = run("icepop", LP, MU, [1.0] * 5, low=0.5, high=2.0)
    assert narrow.token_mask.tolist() == [True, True, False, False, False]
    r = ratios(LP, MU)
    # IcePop [0.5, 5] per-token weight M(r) from docs/losses.md: [1.1052, 1.0, 0, 3.0042, 0]; A = 1 ⇒ ℓ = −M(r)
    close(g_ice, [-r[0], -r[1], 0.0, -r[3], 0.0])
    assert math.isclose(ice.loss.item(), -(r[0] + r[1] + r[3]), rel_tol=1e-6)
    assert math.isclose(ice.loss.item(), -(1.1052 + 1.0 + 3.0042), abs_tol=2e-4)
    close(g_ipo, [-r[0], -r[1], -r[2], 0.0, 0.0])
    assert math.isclose(ipo.loss.item(), -(r[0] + r[1] + r[2]), rel_tol=1e-6)
    assert ipo.metrics["masked_fraction"] == pytest.approx(0.4)
    assert ice.metrics["masked_fraction_low"] == pytest.approx(0.4)  # tokens 3 and 5: r < 0.5
    assert ice.metrics["masked_fraction_high"] == 0.0


# --- IPO ------------------------------------------------------------------------------------------


def test_ipo_hand_vector_with_kl_and_mixed_advantages():
    adv = [1.0, -1.0, 0.5, 2.0, -2.0]
    tau = 0.01
    out, grad = run("ipo", LP, MU, adv, kl_tau=tau)
    r = ratios(LP, MU)
    keep = [abs(math.exp(a) - math.exp(b)) <= 0.3 for a, b in zip(LP, MU)]
    lr = [a - b for a, b in zip(LP, MU)]
    want = sum(-k * A * x + tau * l * l for k, A, x, l in zip(keep, adv, r, lr))
    assert math.isclose(out.loss.item(), want, rel_tol=1e-6)
    # ∂ℓ/∂logπ = −keep·A·r + 2·kl_tau·log r (KL term on ALL loss tokens, masked ones included)
    close(grad, [-k * A * x + 2 * tau * l for k, A, x, l in zip(keep, adv, r, lr)])
    m = out.metrics
    assert m["masked_fraction_pos"] == pytest.approx(1 / 3)  # A > 0: tokens 1, 3, 4 → token 4 masked
    assert m["masked_fraction_neg"] == pytest.approx(1 / 2)  # A < 0: tokens 2, 5 → token 5 masked


def test_ipo_eps_is_a_probability_difference():
    # p = 0.5 vs q = 0.3: |Δp| = 0.2 → kept at eps 0.3, masked at eps 0.1; r = 5/3 either way
    lp, mu = [math.log(0.5)], [math.log(0.3)]
    out, grad = run("ipo", lp, mu, [1.0])
    assert out.token_mask.tolist() == [True]
    close(grad, [-5 / 3])
    out, grad = run("ipo", lp, mu, [1.0], eps=0.1)
    assert out.token_mask.tolist() == [False] and grad == [0.0]


# --- PPO ------------------------------------------------------------------------------------------

# ratios around the effective interval [0.8, 1.2], with both advantage signs
PPO_R = [1.19, 1.21, 0.81, 0.79, 0.5, 3.0, 3.0, 0.5]
PPO_A = [1.0, 1.0, -1.0, -1.0, 2.0, -0.5, 1.5, -1.0]


def test_ppo_hand_vector_and_clip_interval():
    mu = [-1.0] * len(PPO_R)
    lp = [-1.0 + math.log(x) for x in PPO_R]
    out, grad = run("ppo", lp, mu, PPO_A)
    want = sum(-min(x * A, min(max(x, 0.8), 1.2) * A) for x, A in zip(PPO_R, PPO_A))
    assert math.isclose(out.loss.item(), want, rel_tol=1e-6)
    clipped = [False, True, False, True, False, False, True, True]
    assert out.token_mask.tolist() == [not c for c in clipped]
    # clipped tokens get zero gradient; the others −A·r
    close(grad, [0.0 if c else -A * x for c, A, x in zip(clipped, PPO_A, PPO_R)])
    assert out.metrics["masked_fraction"] == pytest.approx(4 / 8)
    assert out.metrics["masked_fraction_pos"] == pytest.approx(2 / 4)  # r > 1.2 with A > 0
    assert out.metrics["masked_fraction_neg"] == pytest.approx(2 / 4)  # r < 0.8 with A < 0


def test_ppo_asymmetric_eps():
    lp, mu = [math.log(1.25), math.log(0.75)], [0.0, 0.0]
    out, grad = run("ppo", lp, mu, [1.0, -1.0], eps_low=0.3, eps_high=0.28)  # band [0.7, 1.28]
    assert out.token_mask.tolist() == [True, True]
    close(grad, [-1.25, 0.75])


# --- CISPO ----------------------------------------------------------------------------------------


def test_cispo_hand_vector_interval_0_5_every_token_has_gradient():
    r = [0.01, 0.5, 1.0, 4.9, 5.5, 40.0]
    adv = [1.0, -1.0, 2.0, 1.0, -0.5, 1.0]
    lp = [-0.3, -1.0, -2.0, -0.7, -1.5, -0.2]
    mu = [a - math.log(x) for a, x in zip(lp, r)]
    out, grad = run("cispo", lp, mu, adv)
    w = [min(max(x, 0.0), 5.0) for x in r]  # effective interval [1 − 1, 1 + 4] = [0, 5]
    assert w == [0.01, 0.5, 1.0, 4.9, 5.0, 5.0]
    assert math.isclose(out.loss.item(), sum(-c * A * a for c, A, a in zip(w, adv, lp)), rel_tol=1e-5)
    close(grad, [-c * A for c, A in zip(w, adv)], tol=1e-4)  # nonzero even where r is clipped
    assert all(g != 0.0 for g in grad)
    assert out.metrics["masked_fraction"] == 0.0
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 6)
    # with eps_low = 0.2 the lower bound becomes 0.8
    out, grad = run("cispo", lp, mu, adv, eps_low=0.2)
    close(grad, [-min(max(x, 0.8), 5.0) * A for x, A in zip(r, adv)], tol=1e-4)


# --- SFT ------------------------------------------------------------------------------------------


def test_sft_is_masked_nll_and_ignores_inference_inputs():
    lp = [-0.5, -1.5, -2.5, -0.25]
    mask = [True, False, True, True]
    out, grad = run("sft", lp, [float("nan")] * 4, [float("nan")] * 4, mask)
    assert math.isclose(out.loss.item(), 0.5 + 2.5 + 0.25, rel_tol=1e-6)
    assert grad == [-1.0, 0.0, -1.0, -1.0]
    assert out.metrics["num_loss_tokens"] == 3 and out.metrics["num_invalid_tokens"] == 0
    out = losses.get("sft")(torch.tensor(lp, requires_grad=True), None, None, torch.tensor(mask))
    assert math.isclose(out.loss.item(), 3.25, rel_tol=1e-6)


# --- masks, NaN and overflow ------------------------------------------------------------------------


@pytest.mark.parametrize("name", losses.BUILTINS)
def test_loss_mask_excludes_tokens(name):
    adv = [1.0, -1.0, 0.5, 2.0, -2.0]
    mask = [True, False, True, False, True]
    out, grad = run(name, LP, MU, adv, mask)
    sub, sub_grad = run(name, [LP[i] for i in (0, 2, 4)], [MU[i] for i in (0, 2, 4)], [adv[i] for i in (0, 2, 4)])
    assert math.isclose(out.loss.item(), sub.loss.item(), rel_tol=1e-6)
    assert grad[1] == 0.0 and grad[3] == 0.0
    close([grad[0], grad[2], grad[4]], sub_grad)
    assert out.metrics["num_loss_tokens"] == 3


@pytest.mark.parametrize("name", losses.BUILTINS)
def test_nan_and_missing_logprobs_never_poison_the_step(name):
    nan, inf = float("nan"), float("inf")
    # tokens 2..5 are invalid: logμ NaN, logμ −inf, logμ +inf, logπ NaN
    lp = [-0.1, -1.0, -2.0, -0.5, nan, -3.0]
    mu = [-0.2, nan, -math.inf, inf, -1.6, -1.0]
    adv = [1.0, -1.0, 0.5, 2.0, -2.0, 1.0]
    out, grad = run(name, lp, mu, adv)
    assert math.isfinite(out.loss.item()) and all(math.isfinite(g) for g in grad)
    valid = [0, 5] if name != "sft" else [0, 1, 2, 3, 5]  # SFT ignores logμ
    ref, ref_grad = run(name, [lp[i] for i in valid], [MU[0], MU[4]] if name != "sft" else [0.0] * 5,
                        [adv[i] for i in valid])
    assert math.isclose(out.loss.item(), ref.loss.item(), rel_tol=1e-6)
    close([grad[i] for i in valid], ref_grad)
    assert all(grad[i] == 0.0 for i in range(6) if i not in valid)
    m = out.metrics
    assert m["num_invalid_tokens"] == 6 - len(valid) and m["num_loss_tokens"] == len(valid)
    assert all(math.isfinite(v) for k, v in m.items() if not k.endswith("_neg") and not k.endswith("_pos"))


@pytest.mark.parametrize("name,adv", [("ipo", 1.0), ("icepop", 1.0), ("ppo", 1.0), ("cispo", -1.0)])
def test_overflowing_ratio_on_a_masked_token_stays_finite(name, adv):
    # r = exp(199) overflows fp32; the token is masked/clipped (or its weight clamped), so no 0·inf
    out, grad = run(name, [-1.0, -0.5], [-200.0, -0.6], [adv, 1.0])
    assert math.isfinite(out.loss.item()) and all(math.isfinite(g) for g in grad)
    if name != "cispo":
        assert grad[0] == 0.0
    else:
        assert math.isclose(grad[0], 5.0 * 1.0, rel_tol=1e-6)  # −clip(r)·A = −5·(−1)


def test_advantage_zero_and_empty_mask_give_a_connected_zero():
    out, grad = run("ipo", LP, MU, [0.0] * 5, [False] * 5)
    assert out.loss.item() == 0.0 and out.loss.requires_grad and grad == [0.0] * 5
    assert out.metrics["num_loss_tokens"] == 0 and math.isnan(out.metrics["ratio_mean"])


# --- registry, params, custom losses --------------------------------------------------------------


def test_defaults_and_default_loss():
    assert losses.DEFAULT_LOSS == "ipo" and losses.get().name == "ipo"
    assert losses.defaults("ipo") == {"eps": 0.3, "kl_tau": 0.0}
    assert losses.defaults("icepop") == {"low": 0.5, "high": 5.0}
    assert losses.defaults("ppo") == {"eps_low": 0.2, "eps_high": 0.2}
    assert losses.defaults("cispo") == {"eps_low": 1.0, "eps_high": 4.0}
    assert losses.defaults("sft") == {}
    assert losses.resolve_params("ipo", {"eps": 0.2}) == {"eps": 0.2, "kl_tau": 0.0}


def test_unknown_loss_lists_builtins():
    with pytest.raises(LossConfigError) as e:
        losses.get("grpo")
    assert isinstance(e.value, ValueError)
    for name in losses.BUILTINS:
        assert name in str(e.value)


@pytest.mark.parametrize("name,params,needle", [
    ("ipo", {"epsilon": 0.2}, "unknown parameter"),
    ("sft", {"eps": 0.2}, "unknown parameter"),
    ("ipo", {"eps": 0.0}, "ipo.eps"),
    ("ipo", {"eps": -0.1}, "ipo.eps"),
    ("ipo", {"kl_tau": -1e-3}, "ipo.kl_tau"),
    ("ipo", {"eps": "0.3"}, "must be a number"),
    ("icepop", {"low": 5.0, "high": 0.5}, "low < high"),
    ("icepop", {"low": 2.0, "high": 2.0}, "low < high"),
    ("ppo", {"eps_low": -0.2}, "ppo.eps_low"),
    ("cispo", {"eps_high": -4.0}, "cispo.eps_high"),
])
def test_bad_params_raise(name, params, needle):
    with pytest.raises(LossConfigError, match=needle):
        losses.resolve_params(name, params)
    with pytest.raises(LossConfigError, match=needle):
        run(name, LP, MU, [1.0] * 5, **params)


CUSTOM = '''
import torch
from vf.trainer.losses import LossOutput, Stat

def scaled_pg(logprobs, inference_logprobs, advantages, loss_mask, *, scale=2.0):
    per_token = -scale * advantages * logprobs
    return per_token[loss_mask].sum(), {"scale": scale}

def full(logprobs, inference_logprobs, advantages, loss_mask, **params):
    return LossOutput(loss=-logprobs[loss_mask].sum(), stats={"n": Stat(len(params), 1, "sum")})

def positive_only(logprobs, inference_logprobs, advantages, loss_mask, *, beta):
    return (beta * logprobs).sum()

def _check(params):
    if params["beta"] <= 0:
        raise ValueError("beta must be > 0")
    return params

positive_only.validate = _check
'''


def test_custom_loss_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_vf_losses.py").write_text(textwrap.dedent(CUSTOM))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_vf_losses", raising=False)
    fn = losses.get("my_vf_losses:scaled_pg")
    assert losses.defaults("my_vf_losses:scaled_pg") == {"scale": 2.0}
    out, grad = run("my_vf_losses:scaled_pg", [-1.0, -2.0], [0.0, 0.0], [1.0, 0.5], scale=3.0)
    assert math.isclose(out.loss.item(), -3.0 * (-1.0 - 1.0), rel_tol=1e-6)
    assert grad == [-3.0, -1.5] and out.metrics == {"scale": 3.0}
    with pytest.raises(LossConfigError, match="unknown parameter"):
        fn(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.ones(1, dtype=torch.bool), eps=1.0)
    out, _ = run("my_vf_losses:full", [-1.0, -2.0], [0.0, 0.0], [1.0, 1.0], anything=1, more=2)
    assert out.loss.item() == 3.0 and out.metrics == {"n": 2.0}
    with pytest.raises(LossConfigError, match="needs parameter"):
        losses.resolve_params("my_vf_losses:positive_only")
    with pytest.raises(ValueError, match="beta must be"):
        losses.resolve_params("my_vf_losses:positive_only", {"beta": -1.0})
    with pytest.raises(LossConfigError, match="no attribute"):
        losses.get("my_vf_losses:nope")
    with pytest.raises(LossConfigError, match="cannot import"):
        losses.get("no_such_pkg_xyz.mod:fn")


def test_import_of_losses_package_does_not_import_torch():
    import subprocess

    code = "import sys, vf.trainer.losses as L; L.reduce_metrics([]); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
