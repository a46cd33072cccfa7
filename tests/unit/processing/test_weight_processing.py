"""Weight processing (docs/numerics.md#weight-processing): every step leaves the model's predictions unchanged.

Processed and unprocessed twins run the same tokens; log-probs, loss, patterns and the
centered residual stream must agree within `1e-5` (docs/numerics.md#tolerances), and processing twice must
equal processing once bitwise.
"""

from __future__ import annotations

import copy
import itertools
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.config import ConfigError
from hooked.processing import steps as wp
from tests.tiny_models import hooked_from, tiny_gpt2

torch.set_num_threads(1)

ATOL = 1e-5  # docs/numerics.md#tolerances: folding invariance on tiny fp32 models
FLAGS = wp.STEPS  # fold_ln, center_writing_weights, center_unembed, fold_value_biases, refactor_...
BASE = dict(d_model=32, d_head=8, n_heads=4, n_layers=2, n_ctx=16, d_vocab=50, act_fn="gelu_new", seed=0)


def make(bias: bool = True, seed: int = 0, **overrides) -> HookedTransformer:
    """A random model whose biases and norm gains are random too (init would make them 0 and 1)."""
    cfg = dict(BASE, device="cpu")
    cfg.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w":
                p.copy_(1 + 0.2 * noise)
            elif leaf.startswith(("W_", "_W_")):
                p.copy_(noise / p.shape[-2] ** 0.5)
            else:
                p.copy_(0.2 * noise if bias else torch.zeros_like(p))
    return model


def tokens(batch: int = 2, pos: int = 10, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def flag_dict(on: tuple[str, ...]) -> dict[str, bool]:
    return {f: f in on for f in FLAGS}


def processed(model: HookedTransformer, **flags) -> HookedTransformer:
    twin = copy.deepcopy(model)
    twin.process_weights_(**flags)
    return twin


def refactor_allowed(cfg: HookedTransformerConfig) -> bool:
    try:
        wp.check_refactorable(cfg)
        return True
    except ConfigError:
        return False


def centered(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


def invariance_errors(ref: HookedTransformer, proc: HookedTransformer, toks: torch.Tensor) -> dict[str, float]:
    """Max-abs differences of everything docs/numerics.md#weight-processing says processing must keep."""
    with torch.no_grad():
        logits_r, cache_r = ref.run_with_cache(toks)
        logits_p, cache_p = proc.run_with_cache(toks)
        loss_r, loss_p = ref(toks, return_type="loss"), proc(toks, return_type="loss")
    shift = logits_p - logits_r
    errors = {
        "log_softmax": (logits_p.log_softmax(-1) - logits_r.log_softmax(-1)).abs().max().item(),
        "loss": (loss_p - loss_r).abs().item(),
        "logit_shift_not_constant": (shift - shift.mean(-1, keepdim=True)).abs().max().item(),
    }
    for layer in range(ref.cfg.n_layers):
        errors[f"pattern{layer}"] = (cache_p["pattern", layer] - cache_r["pattern", layer]).abs().max().item()
        resid_p, resid_r = centered(cache_p["resid_post", layer]), centered(cache_r["resid_post", layer])
        errors[f"center_resid_post{layer}"] = (resid_p - resid_r).abs().max().item()
    return errors


def assert_invariant(ref, proc, toks, label=""):
    errors = invariance_errors(ref, proc, toks)
    bad = {k: v for k, v in errors.items() if not v <= ATOL}
    assert not bad, f"{label}: {bad}"
    return max(errors.values())


def state_snapshot(model: HookedTransformer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# -- configurations ------------------------------------------------------------------------

CONFIGS = {
    "ln": dict(),
    "ln_nobias": dict(bias=False),
    "rms": dict(normalization_type="RMS"),
    "rms_nobias": dict(normalization_type="RMS", bias=False),
    "gqa2": dict(n_key_value_heads=2),
    "gqa4_rms_gated_rotary": dict(
        n_key_value_heads=1, normalization_type="RMS", gated_mlp=True, act_fn="silu", positional_embedding_type="rotary"
    ),
    "ln_gated": dict(gated_mlp=True, act_fn="silu"),
    "gqa2_ln_gated": dict(n_key_value_heads=2, gated_mlp=True, act_fn="silu"),
    "parallel": dict(parallel_attn_mlp=True),
    "attn_only": dict(attn_only=True, act_fn=None),
    "rotary_ln": dict(positional_embedding_type="rotary", rotary_dim=4),
    "final_rms": dict(final_rms=True),
    "solu_ln": dict(act_fn="solu_ln"),
    "sandwich_rms_qknorm": dict(
        normalization_type="RMS",
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        positional_embedding_type="rotary",
        n_key_value_heads=2,
    ),
    "soft_caps": dict(output_logits_soft_cap=5.0, attn_scores_soft_cap=10.0),
    "no_norm": dict(normalization_type=None),
    "shortformer": dict(positional_embedding_type="shortformer"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_flag_combination_is_invariant(name):
    """All 32 flag combinations (refactor where allowed) keep log-probs, loss, patterns, centered resid."""
    model, toks = make(**CONFIGS[name]), tokens()
    worst = 0.0
    for n in range(len(FLAGS) + 1):
        for on in itertools.combinations(FLAGS, n):
            flags = flag_dict(on)
            if flags["refactor_factored_attn_matrices"] and not refactor_allowed(model.cfg):
                with pytest.raises(ConfigError):
                    processed(model, **flags)
                continue
            worst = max(worst, assert_invariant(model, processed(model, **flags), toks, f"{name} {on}"))
    print(f"{name}: max invariance error {worst:.2e}")


@pytest.mark.parametrize("name", ["ln", "rms", "gqa4_rms_gated_rotary", "solu_ln", "final_rms", "parallel"])
def test_processing_twice_equals_once_bitwise(name, caplog):
    model = make(**CONFIGS[name])
    flags = dict(refactor_factored_attn_matrices=refactor_allowed(model.cfg))
    once = processed(model, **flags)
    snapshot, recorded = state_snapshot(once), once.cfg.weight_processing
    with caplog.at_level(logging.WARNING, logger="hooked.processing.steps"):
        once.process_weights_(**flags)
    assert_bitwise_equal(state_snapshot(once), snapshot)
    assert once.cfg.weight_processing == recorded
    assert any("already applied" in r.getMessage() for r in caplog.records)
    # and processing is deterministic: a second twin processed once is bitwise the same
    assert_bitwise_equal(state_snapshot(processed(model, **flags)), snapshot)


def test_steps_are_recorded_in_order_and_norms_become_pre():
    model = processed(make(), refactor_factored_attn_matrices=True)
    assert model.cfg.weight_processing == FLAGS
    assert model.cfg.normalization_type == "LNPre"
    assert all(type(b.ln1).__name__ == "LayerNormPre" and type(b.ln2).__name__ == "LayerNormPre" for b in model.blocks)
    assert type(model.ln_final).__name__ == "LayerNormPre"
    assert not any(".ln" in k for k in model.state_dict())
    assert "blocks.0.ln1.hook_scale" in model.hook_dict  # setup() re-indexed the new modules
    rms = processed(make(normalization_type="RMS"))
    assert rms.cfg.normalization_type == "RMSPre" and type(rms.ln_final).__name__ == "RMSNormPre"
    assert rms.cfg.weight_processing == ("fold_ln", "center_unembed", "fold_value_biases")  # centering skipped


def test_transformer_lens_style_checks_after_folding_and_centering():
    model = processed(make(gated_mlp=True, act_fn="silu"))
    sd = model.state_dict()
    zero = lambda x: torch.testing.assert_close(x, torch.zeros_like(x), atol=1e-6, rtol=0)  # noqa: E731
    for key in ("embed.W_E", "pos_embed.W_pos"):
        zero(sd[key].mean(-1))
    for layer in range(model.cfg.n_layers):
        for key in ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out"):
            zero(sd[f"blocks.{layer}.{key}"].mean(-1))
        zero(sd[f"blocks.{layer}.attn.b_V"])
        for key in ("attn.W_Q", "attn.W_K", "attn.W_V", "mlp.W_in", "mlp.W_gate"):  # readers of LNPre: centered
            zero(sd[f"blocks.{layer}.{key}"].mean(-2))
    zero(sd["unembed.W_U"].mean(-1))
    zero(sd["unembed.b_U"].mean(-1))


def test_hook_values_per_step_follow_the_spec_table():
    """fold_ln changes no hook; centering keeps q/k/v/pattern/z/pre/post; value-bias fold keeps attn_out."""
    model, toks = make(), tokens()
    _, ref = model.run_with_cache(toks)

    def max_diff(cache, names):  # masked scores are -inf in both: count equal entries as 0
        return max(torch.where(cache[n] == ref[n], 0.0, (cache[n] - ref[n]).abs()).max().item() for n in names)

    _, folded = processed(model, **flag_dict(("fold_ln",))).run_with_cache(toks)
    assert folded.keys() == ref.keys()
    # unembed.hook_in is ln_final's output, which loses the gain and bias that W_U/b_U now apply
    assert max_diff(folded, [n for n in ref if n != "unembed.hook_in"]) <= ATOL
    _, cent = processed(model, **flag_dict(("center_writing_weights",))).run_with_cache(toks)
    kept = (
        "hook_q",
        "hook_k",
        "hook_v",
        "hook_pattern",
        "hook_z",
        "hook_pre",
        "hook_post",
        "hook_scale",
        "hook_normalized",
    )
    same = [n for n in ref if n.split(".")[-1] in kept]
    assert max_diff(cent, same) <= ATOL
    _, vb = processed(model, **flag_dict(("fold_value_biases",))).run_with_cache(toks)
    same = [n for n in ref if not n.endswith(("hook_v", "hook_z"))]
    assert max_diff(vb, same) <= ATOL
    b_V = model.blocks[0].attn.b_V
    torch.testing.assert_close(vb["blocks.0.attn.hook_v"], ref["blocks.0.attn.hook_v"] - b_V, atol=ATOL, rtol=0)
    _, rf = processed(model, **flag_dict(("refactor_factored_attn_matrices",))).run_with_cache(toks)
    same = [n for n in ref if not n.endswith(("hook_q", "hook_k", "hook_v", "hook_z"))]
    assert max_diff(rf, same) <= ATOL


def test_norms_that_must_not_fold_keep_their_parameters():
    model = processed(make(**CONFIGS["sandwich_rms_qknorm"]))
    keys = set(model.state_dict())
    for layer in range(2):
        for name in ("ln1_post.w", "ln2_post.w", "attn.q_norm.w", "attn.k_norm.w"):
            assert f"blocks.{layer}.{name}" in keys
        assert f"blocks.{layer}.ln1.w" not in keys and f"blocks.{layer}.ln2.w" not in keys


@pytest.mark.parametrize("name", ["final_rms", "sandwich_rms_qknorm", "solu_ln", "ln"])
def test_a_processed_config_rebuilds_a_model_that_loads_the_processed_weights(name):
    proc = processed(make(**CONFIGS[name]))
    rebuilt = HookedTransformer(copy.deepcopy(proc.cfg))
    rebuilt.load_state_dict(proc.state_dict())
    toks = tokens()
    torch.testing.assert_close(rebuilt(toks), proc(toks), atol=0, rtol=0)


def test_automatic_skips_are_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="hooked.processing.steps"):
        short = processed(make(positional_embedding_type="shortformer"))
    assert short.cfg.weight_processing == ("fold_value_biases",)
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert all(f"Skipping {s}: shortformer" in warned for s in FLAGS[:3])
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="hooked.processing.steps"):
        capped = processed(make(output_logits_soft_cap=5.0))
    assert "center_unembed" not in capped.cfg.weight_processing
    assert any("soft_cap" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="hooked.processing.steps"):
        processed(make(normalization_type="RMS"))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # RMS: centering skipped silently
    assert any("Skipping center_writing_weights" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(positional_embedding_type="rotary"), "rotary"),
        (dict(use_qk_norm=True), "qk-norm"),
        (dict(n_key_value_heads=2), "grouped-query"),
    ],
)
def test_refactor_raises_before_changing_anything(overrides, match):
    model = make(**overrides)
    before = state_snapshot(model)
    with pytest.raises(ConfigError, match=match):
        model.process_weights_(refactor_factored_attn_matrices=True)
    assert model.cfg.weight_processing == () and model.cfg.normalization_type == "LN"
    assert_bitwise_equal(state_snapshot(model), before)


def test_bf16_is_processed_in_fp32_then_cast():
    """Each tensor is computed in fp32 and cast once per step: a bf16 fold equals the fp32 fold cast to bf16."""
    fp32 = make()
    with torch.no_grad():
        for p in fp32.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    fp32.process_weights_(**flag_dict(("fold_ln",)))
    bf16.process_weights_(**flag_dict(("fold_ln",)))
    expected = {k: v.to(torch.bfloat16) for k, v in fp32.state_dict().items()}
    assert_bitwise_equal(state_snapshot(bf16), expected)
    bf16.process_weights_(refactor_factored_attn_matrices=True)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


# -- the pure state-dict functions -----------------------------------------------------------


def test_state_dict_functions_never_write_into_their_inputs():
    model = make(n_key_value_heads=2, gated_mlp=True, act_fn="silu")
    sd = model.state_dict()
    originals = {k: v.clone() for k, v in sd.items()}
    tensors = dict(sd)
    for fn in (model.fold_layer_norm, model.center_writing_weights, model.center_unembed, model.fold_value_biases):
        sd = fn(sd)
    for k, v in tensors.items():
        assert torch.equal(v, originals[k]), k
    assert "blocks.0.ln1.w" not in sd and "blocks.0.attn._b_V" in sd
    assert torch.count_nonzero(sd["blocks.1.attn._b_V"]) == 0


def test_fold_layer_norm_math_for_one_reader():
    """b_Q += b @ W_Q; W_Q = diag(w) W_Q; W_Q -= mean over d_model (TransformerLens's formulas)."""
    model = make()
    sd = model.state_dict()
    w, b = sd["blocks.0.ln1.w"], sd["blocks.0.ln1.b"]
    W_Q, b_Q = sd["blocks.0.attn.W_Q"], sd["blocks.0.attn.b_Q"]
    out = wp.fold_layer_norm(dict(sd), model.cfg)
    expected_W = W_Q * w[None, :, None]
    expected_W = expected_W - expected_W.mean(1, keepdim=True)
    torch.testing.assert_close(out["blocks.0.attn.W_Q"], expected_W, atol=1e-6, rtol=0)
    torch.testing.assert_close(out["blocks.0.attn.b_Q"], b_Q + (W_Q * b[None, :, None]).sum(1), atol=1e-6, rtol=0)
    assert out["blocks.0.attn.W_Q"].permute(1, 0, 2).is_contiguous()  # the head-major layout is kept


def test_moe_state_dict_fold_and_centering():
    """TL MoE layout (nn.Linear [out, in]): RMS gain folds into the router and experts; W_out centers on d."""
    d, dm, E = 8, 12, 3
    cfg = HookedTransformerConfig(
        d_model=d,
        d_head=4,
        n_layers=1,
        n_ctx=4,
        d_vocab=10,
        d_mlp=dm,
        act_fn="silu",
        normalization_type="RMS",
        gated_mlp=True,
        num_experts=E,
        experts_per_token=2,
    )
    g = torch.Generator().manual_seed(0)
    sd = {
        "blocks.0.ln2.w": torch.rand(d, generator=g) + 0.5,
        "blocks.0.mlp.W_gate.weight": torch.randn(E, d, generator=g),
    }
    for e in range(E):
        p = f"blocks.0.mlp.experts.{e}."
        sd[p + "W_in.weight"], sd[p + "W_gate.weight"] = (
            torch.randn(dm, d, generator=g),
            torch.randn(dm, d, generator=g),
        )
        sd[p + "W_out.weight"] = torch.randn(d, dm, generator=g)
    before = {k: v.clone() for k, v in sd.items()}
    w = sd["blocks.0.ln2.w"]
    wp._fold_moe(
        sd, cfg, "blocks.0.", wp._experts(sd, "blocks.0."), layernorm=False, fold_biases=False, center_weights=False
    )
    assert "blocks.0.ln2.w" not in sd
    torch.testing.assert_close(sd["blocks.0.mlp.W_gate.weight"], before["blocks.0.mlp.W_gate.weight"] * w)
    torch.testing.assert_close(
        sd["blocks.0.mlp.experts.2.W_in.weight"], before["blocks.0.mlp.experts.2.W_in.weight"] * w
    )
    sd.update(
        {
            "embed.W_E": torch.randn(10, d, generator=g),
            "blocks.0.attn.W_O": torch.randn(2, 4, d, generator=g),
            "blocks.0.attn.b_O": torch.randn(d, generator=g),
        }
    )
    wp.center_writing_weights(sd, cfg)
    W_out = sd["blocks.0.mlp.experts.1.W_out.weight"]
    torch.testing.assert_close(W_out.mean(0), torch.zeros(dm), atol=1e-6, rtol=0)


# -- HuggingFace GPT-2 (tied embeddings) -------------------------------------------------------


def test_gpt2_all_flag_combinations_match_unprocessed_and_hf():
    hf = tiny_gpt2(n_embd=32, n_head=4, vocab_size=100, n_positions=32)
    ref = hooked_from(hf)
    toks = tokens(vocab=100)
    with torch.no_grad():
        hf_logp = hf(toks).logits.log_softmax(-1)
    hf_state = {k: v.clone() for k, v in hf.state_dict().items()}
    worst = 0.0
    for n in range(len(FLAGS) + 1):
        for on in itertools.combinations(FLAGS, n):
            model = hooked_from(hf, **flag_dict(on))
            worst = max(worst, assert_invariant(ref, model, toks, str(on)))
            with torch.no_grad():
                assert (model(toks).log_softmax(-1) - hf_logp).abs().max() <= ATOL
    for k, v in hf.state_dict().items():  # the user's HF model is never written
        assert torch.equal(v, hf_state[k]), k
    print(f"gpt2: max invariance error {worst:.2e}")


def test_load_time_processing_equals_process_weights_on_a_loaded_model():
    hf = tiny_gpt2(n_embd=32, n_head=4, vocab_size=100, n_positions=32)
    at_load = hooked_from(hf, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True)
    later = hooked_from(hf)
    later.process_weights_()
    assert later.cfg.weight_processing == at_load.cfg.weight_processing
    a, b = state_snapshot(at_load), state_snapshot(later)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "on, tied",
    [
        ((), True),
        (("fold_value_biases",), True),
        (("refactor_factored_attn_matrices",), True),
        (("center_writing_weights",), False),
        (("center_unembed",), False),
        (("fold_ln",), False),
    ],
)
def test_tied_embeddings_stay_shared_unless_processing_writes_them(on, tied, caplog):
    hf = tiny_gpt2(n_embd=32, n_head=4, vocab_size=100, n_positions=32)
    with caplog.at_level(logging.DEBUG, logger="hooked.processing.steps"):  # (expected, so logged at debug)
        model = hooked_from(hf, **flag_dict(on))
    assert model.embeddings_tied() == tied
    wte = hf.transformer.wte.weight
    if "center_writing_weights" not in on:  # W_E itself is only written by centering
        assert torch.equal(model.W_E, wte)
    if not tied:
        assert any("untied" in r.getMessage() for r in caplog.records)
        if on == ("center_writing_weights",):  # W_U keeps the uncentered embedding
            assert torch.equal(model.W_U, wte.T)


def tie(model: HookedTransformer) -> HookedTransformer:
    """Make W_U a view of W_E (deepcopy clones parameters, so twins must be re-tied)."""
    model.unembed._parameters["W_U"] = torch.nn.Parameter(model.embed.W_E.T)
    assert model.embeddings_tied()
    return model


def test_rms_tied_model_unties_only_when_w_u_is_written():
    model, toks = tie(make(normalization_type="RMS")), tokens()
    ref = copy.deepcopy(model)
    kept = tie(copy.deepcopy(model))
    kept.process_weights_(**flag_dict(("center_writing_weights", "fold_value_biases")))  # centering: skipped (RMS)
    assert kept.embeddings_tied()
    split = tie(copy.deepcopy(model))
    split.process_weights_()
    assert not split.embeddings_tied()
    torch.testing.assert_close(split.W_E, ref.W_E, atol=0, rtol=0)
    assert_invariant(ref, split, toks)


# -- random configurations ------------------------------------------------------------------------


@st.composite
def configs(draw):
    attn_only = draw(st.booleans())
    gated = not attn_only and draw(st.booleans())
    cfg = dict(
        normalization_type=draw(st.sampled_from(["LN", "RMS"])),
        n_key_value_heads=draw(st.sampled_from([None, 2, 1])),
        positional_embedding_type=draw(st.sampled_from(["standard", "rotary"])),
        attn_only=attn_only,
        gated_mlp=gated,
        act_fn=None if attn_only else ("silu" if gated else draw(st.sampled_from(["gelu_new", "relu", "solu_ln"]))),
        parallel_attn_mlp=not attn_only and draw(st.booleans()),
        n_layers=draw(st.integers(1, 2)),
        bias=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )
    on = tuple(f for f in FLAGS[:4] if draw(st.booleans()))
    return cfg, on


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_configs_are_invariant_and_idempotent(case):
    overrides, on = case
    model, toks = make(**overrides), tokens(seed=overrides["seed"])
    flags = flag_dict(on)
    if refactor_allowed(model.cfg):
        flags["refactor_factored_attn_matrices"] = True
    proc = processed(model, **flags)
    assert_invariant(model, proc, toks, str(case))
    snapshot = state_snapshot(proc)
    logging.disable(logging.WARNING)
    try:
        proc.process_weights_(**flags)
    finally:
        logging.disable(logging.NOTSET)
    assert_bitwise_equal(state_snapshot(proc), snapshot)


def test_processing_returns_weights_and_steps_and_leaves_the_model_alone():
    """`process_state_dict` is pure: the model's config and modules change only when the model records the steps."""
    model = make()
    cfg_before = copy.deepcopy(model.cfg)
    modules_before = [type(m) for m in model.modules()]
    flags = dict.fromkeys(FLAGS, True) | {"refactor_factored_attn_matrices": False}
    sd, steps = wp.process_state_dict(model.cfg, model.state_dict(), **flags)
    assert steps == ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
    assert model.cfg == cfg_before and [type(m) for m in model.modules()] == modules_before
    assert "blocks.0.ln1.w" not in sd and "blocks.0.ln1.w" in model.state_dict()  # folded into the readers
    model.record_weight_processing(steps)
    assert model.cfg.normalization_type == "LNPre" and model.cfg.weight_processing == steps
    assert type(model.blocks[0].ln1).__name__ == "LayerNormPre" and set(model.state_dict()) == set(sd)
