"""docs/transformerlens-migration.md's TransformerLens checklist stays true.

Every `hooked` path it names resolves (rows marked missing must not). Every row marked `differs` states a
behaviour; BEHAVIOURS below holds one check per such row, keyed by the row's first path, with a phrase the
row must keep: if the row's text loses the phrase, or the code stops doing what the row says, a test fails.
"""

import importlib
import re
import warnings
from pathlib import Path

import pytest
import torch

PAGE = Path(__file__).resolve().parents[3] / "docs" / "transformerlens-migration.md"
SECTION = "## TransformerLens checklist"
PATH = re.compile(r"`(hooked\.[A-Za-z_][\w.]*)`")


def table_rows():
    """`(hooked cell, status cell)` of every checklist row."""
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE.name} lost its {SECTION!r} section"
    for line in text[text.index(SECTION) :].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and line.startswith("|") and not set(cells[0]) <= {"-"}:
            yield cells[1], cells[2]


def rows():
    for hooked_cell, status in table_rows():
        for path in PATH.findall(hooked_cell):
            yield path, status


def resolves(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


ROWS = list(rows())


def test_checklist_names_many_paths():
    assert len(ROWS) > 100


@pytest.mark.parametrize("path, status", ROWS, ids=[p for p, _ in ROWS])
def test_path_matches_status(path, status):
    if status.lstrip("*").startswith("missing"):
        assert not resolves(path), f"{path} exists now: update its row in {PAGE.name}'s checklist"
    else:
        assert resolves(path), f"{path} is listed as {status.split(':')[0]!r} but does not exist"


# -- the behaviour each `differs` row states -------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2():
    from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

    return hooked_from(tiny_gpt2(vocab_size=300), tokenizer=make_tokenizer())


@pytest.fixture(scope="module")
def gqa():
    from hooked import HookedTransformer
    from tests.tiny_models import tiny_hf

    return HookedTransformer.from_pretrained("llama", hf_model=tiny_hf("Llama", num_key_value_heads=2))


def _ids(model, n=8, batch=1):
    return torch.randint(3, model.cfg.d_vocab, (batch, n), generator=torch.Generator().manual_seed(n))


def check_from_pretrained(gpt2, gqa, capsys):
    from hooked import HookedTransformer
    from tests.tiny_models import tiny_gpt2

    hf = tiny_gpt2()
    with pytest.raises(Exception, match="CUDA devices"):  # n_devices=2 places blocks on cuda:0 and cuda:1 (none here)
        HookedTransformer.from_pretrained("gpt2", hf_model=hf, n_devices=2)
    parts = ["embed", "pos_embed", "blocks.0", "blocks.1", "ln_final", "unembed"]
    split = HookedTransformer.from_pretrained("gpt2", hf_model=hf, device_map={part: "cpu" for part in parts})
    assert split.hf_device_map["blocks.1"] == "cpu"


def check_to(gpt2, gqa, capsys):
    gpt2.to("cpu", print_details=True)
    assert capsys.readouterr().out == ""


def check_forward(gpt2, gqa, capsys):
    tokens = _ids(gpt2)
    embeds = gpt2.embed(tokens)  # [batch, pos, d_model] token embeddings, positions still added by forward
    torch.testing.assert_close(gpt2(embeds), gpt2(tokens), atol=1e-6, rtol=0)


def check_to_tokens(gpt2, gqa, capsys):
    tokens, mask = gpt2.to_tokens(["Hi", "The quick brown fox"], return_attention_mask=True)
    assert tokens.shape == mask.shape and mask[0].sum() < mask[1].sum()
    bos = gpt2.tokenizer.bos_token_id
    once = gpt2.to_tokens(gpt2.tokenizer.bos_token + "Hi", prepend_bos=True)[0]
    assert (once == bos).sum() == 1  # never a double BOS


def check_add_hook(gpt2, gqa, capsys):
    from hooked import HookNotEnabledError

    with pytest.raises(KeyError, match="hook_resid_pre"):
        gpt2.add_hook("blocks.0.hook_resid_prex", lambda x, hook: None)
    with pytest.raises(HookNotEnabledError, match="use_attn_result"):
        gpt2.add_hook("blocks.0.attn.hook_result", lambda x, hook: None)
    gpt2.reset_hooks()


def check_run_with_cache(gpt2, gqa, capsys):
    tokens = _ids(gpt2)
    with pytest.raises(Exception, match="blocks.0.hook_resid_prex"):
        gpt2.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_prex"])
    _, cache = gpt2.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    assert torch.equal(cache.tokens, tokens)
    _, cache = gpt2.run_with_cache(["Hi", "The quick brown fox"], names_filter="blocks.0.hook_resid_pre")
    assert (
        cache.attention_mask.shape == cache.tokens.shape
        and cache.attention_mask[0].sum() < cache.attention_mask[1].sum()
    )


def check_generate(gpt2, gqa, capsys):
    from hooked.core.utils import at_steps

    seen = []
    record_pos = at_steps(lambda x, hook: seen.append(x.shape[1]), 1)
    out = gpt2.generate("The quick", max_new_tokens=3, seed=0, repetition_penalty=1.2, return_cache=True, verbose=False,
                        fwd_hooks=[("blocks.0.hook_resid_pre", record_pos)])  # fmt: skip
    assert seen == [1] and "blocks.0.hook_resid_pre" in out.cache
    chunks = list(gpt2.generate_stream("The quick", max_new_tokens=2, temperature=0, verbose=False))
    assert chunks


def check_activation_cache(gpt2, gqa, capsys):
    _, cache = gpt2.run_with_cache(["Hi", "The quick brown fox"])  # padded text: the tokenizer's mask is kept
    assert cache.tokens.shape == cache.attention_mask.shape and cache.attention_mask.min() == 0


def check_contains(gpt2, gqa, capsys):
    _, cache = gpt2.run_with_cache(_ids(gpt2))
    assert ("pattern", 0) in cache and ("pattern", 7) not in cache


def check_generic_activation_patch(gpt2, gqa, capsys):
    from hooked.analysis.patching import generic_activation_patch, layer_pos_patch_setter

    clean, corrupted = _ids(gpt2, 6), _ids(gpt2, 6).flip(-1)
    _, clean_cache = gpt2.run_with_cache(clean)

    def metric(logits):
        return logits[0, -1, 5]

    args = (gpt2, corrupted, clean_cache, metric, layer_pos_patch_setter, "resid_pre", ["layer", "pos"])
    one = generic_activation_patch(*args, verbose=False)  # batch_size=1: one forward per patch
    capsys.readouterr()
    many = generic_activation_patch(*args, batch_size=None)  # automatic: many patches per forward
    torch.testing.assert_close(one, many, atol=1e-5, rtol=0)
    assert "patching resid_pre" in capsys.readouterr().err  # the tqdm progress bar
    listed = generic_activation_patch(*args[:6], index_df=[(1, 0), (0, 5)], verbose=False)
    torch.testing.assert_close(listed, torch.stack([one[1, 0], one[0, 5]]), atol=1e-5, rtol=0)


def _patch_inputs(model):
    clean, corrupted = _ids(model, 5), _ids(model, 5).flip(-1)
    _, clean_cache = model.run_with_cache(clean)
    return corrupted, clean_cache, lambda logits: logits[0, -1, 5]


def check_get_act_patch_resid_pre(gpt2, gqa, capsys):
    from hooked.analysis.patching import generic_activation_patch, get_act_patch_resid_pre, layer_pos_patch_setter

    corrupted, clean_cache, metric = _patch_inputs(gpt2)
    fast = get_act_patch_resid_pre(gpt2, corrupted, clean_cache, metric, verbose=False)
    slow = generic_activation_patch(gpt2, corrupted, clean_cache, metric, layer_pos_patch_setter, "resid_pre",
                                    ["layer", "pos"], batch_size=1, verbose=False)  # fmt: skip
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def check_head_by_pos(gpt2, gqa, capsys):
    from hooked.analysis.patching import get_act_patch_attn_head_k_by_pos

    corrupted, clean_cache, metric = _patch_inputs(gqa)
    out = get_act_patch_attn_head_k_by_pos(gqa, corrupted, clean_cache, metric, verbose=False)
    assert out.shape == (gqa.cfg.n_layers, 5, gqa.cfg.n_key_value_heads)


def check_pattern_by_pos(gpt2, gqa, capsys):
    from hooked.analysis.patching import get_act_patch_attn_head_pattern_by_pos

    corrupted, clean_cache, metric = _patch_inputs(gpt2)
    out = get_act_patch_attn_head_pattern_by_pos(gpt2, corrupted, clean_cache, metric, verbose=False)
    assert out.shape == (gpt2.cfg.n_layers, gpt2.cfg.n_heads, 5)


def check_head_all_pos(gpt2, gqa, capsys):
    from hooked.analysis.patching import get_act_patch_attn_head_v_all_pos

    corrupted, clean_cache, metric = _patch_inputs(gqa)
    out = get_act_patch_attn_head_v_all_pos(gqa, corrupted, clean_cache, metric, verbose=False)
    assert out.shape == (gqa.cfg.n_layers, gqa.cfg.n_key_value_heads)


def check_every(gpt2, gqa, capsys):
    from hooked.analysis.patching import get_act_patch_attn_head_all_pos_every

    corrupted, clean_cache, metric = _patch_inputs(gqa)
    out = get_act_patch_attn_head_all_pos_every(gqa, corrupted, clean_cache, metric, verbose=False)
    assert out.shape == (5, gqa.cfg.n_layers, gqa.cfg.n_heads)
    n_kv = gqa.cfg.n_key_value_heads
    assert (out[2, :, n_kv:] == 0).all() and (out[3, :, n_kv:] == 0).all()  # k, v zero-padded from Hkv to H


def check_detect_head(gpt2, gqa, capsys):
    from hooked.analysis.head_detector import detect_head

    tokens = _ids(gpt2, 10)
    _, cache = gpt2.run_with_cache(tokens)
    before = cache["pattern", 0].clone()
    detect_head(gpt2, tokens, "previous_token_head", cache=cache, exclude_bos=True, exclude_current_token=True)
    assert torch.equal(cache["pattern", 0], before)


def check_vh(gpt2, gqa, capsys):
    from hooked.core.factored_matrix import FactoredMatrix

    m = FactoredMatrix(torch.randn(4, 3), torch.randn(3, 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vh = m.Vh
    assert torch.equal(vh, m.V) and any(issubclass(w.category, DeprecationWarning) for w in caught)


def check_eigenvalues(gpt2, gqa, capsys):
    from hooked.core.factored_matrix import FactoredMatrix

    m = FactoredMatrix(torch.randn(4, 3, dtype=torch.bfloat16), torch.randn(3, 4, dtype=torch.bfloat16))
    assert m.eigenvalues.shape == (3,)  # torch.linalg.eig refuses bfloat16: the factors were upcast


def _shortformer_cache():
    from tests.tiny_models import tiny_hooked

    model = tiny_hooked("attn_only_shortformer")
    return model.run_with_cache(_ids(model, 6, batch=2))[1]


def check_decompose_resid(gpt2, gqa, capsys):
    cache = _shortformer_cache()
    stack, labels = cache.decompose_resid(return_labels=True)
    assert "pos_embed" not in labels  # it feeds q and k only
    torch.testing.assert_close(stack.sum(0), cache["resid_post", -1], rtol=1e-5, atol=1e-5)


def check_full_resid_decomposition(gpt2, gqa, capsys):
    cache = _shortformer_cache()
    stack, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert "pos_embed" not in labels
    torch.testing.assert_close(stack.sum(0), cache["resid_post", -1], rtol=1e-5, atol=1e-5)


def check_stack_head_results(gpt2, gqa, capsys):
    _, cache = gpt2.run_with_cache(_ids(gpt2))
    stack, labels = cache.stack_head_results(layer=0, incl_remainder=True, return_labels=True)
    assert labels == ["remainder"] and torch.equal(stack[0], cache["resid_pre", 0])


def check_stack_neuron_results(gpt2, gqa, capsys):
    _, cache = gpt2.run_with_cache(_ids(gpt2))
    stack, labels = cache.stack_neuron_results(layer=0, incl_remainder=True, return_labels=True)
    assert labels == ["remainder"] and torch.equal(stack[0], cache["resid_pre", 0])
    stack, labels = cache.stack_neuron_results(layer=2, neuron_slice=3, return_labels=True)
    assert labels == ["L0N3", "L1N3"] and stack.shape == (2, *cache["resid_pre", 0].shape)


def check_apply_ln_to_stack(gpt2, gqa, capsys):
    from hooked.core.errors import InputError

    _, cache = gpt2.run_with_cache(_ids(gpt2, batch=2))
    scaled = cache.decompose_resid(apply_ln=True, pos_slice=-1)
    with pytest.raises(InputError, match="already scaled"):
        cache.apply_ln_to_stack(scaled, pos_slice=-1)
    last = cache["resid_post", -1][:, -1]  # [batch, d_model]: no component axis, as TL divides it
    centered = last - last.mean(-1, keepdim=True)
    expected = centered / cache["ln_final.hook_scale"][:, -1]
    torch.testing.assert_close(cache.apply_ln_to_stack(last, pos_slice=-1), expected, rtol=0, atol=0)
    with pytest.raises(InputError, match="pos_slice"):
        cache.apply_ln_to_stack(last[None], pos_slice=[0, 1, 2])  # 3 positions: the scale does not broadcast


def check_logit_attrs(gpt2, gqa, capsys):
    tokens = _ids(gpt2, batch=2)
    logits, cache = gpt2.run_with_cache(tokens)
    answer = torch.tensor([5, 7])  # one token per sequence, for a stack of every position
    attrs = cache.logit_attrs(cache["resid_post", -1][None], answer)  # [1, batch, pos]
    # unfolded ln_final: its gain multiplies the direction, so this is the logit less b_U and ln_final's bias
    normalized = cache["ln_final.hook_normalized"] * gpt2.ln_final.w  # [batch, pos, d_model]
    expected = torch.einsum("bpd,db->bp", normalized, gpt2.W_U[:, answer])
    torch.testing.assert_close(attrs[0], expected, rtol=1e-5, atol=1e-5)
    unembed_bias = gpt2.b_U[answer] + gpt2.ln_final.b @ gpt2.W_U[:, answer]  # [batch]
    torch.testing.assert_close(
        attrs[0] + unembed_bias[:, None],
        logits.gather(-1, answer[:, None, None].expand(2, 8, 1))[..., 0],
        rtol=1e-5,
        atol=1e-5,
    )


#: row's first path -> (phrase the row's status must contain, check)
BEHAVIOURS = {
    "hooked.models.hooked_transformer.HookedTransformer.from_pretrained": (
        "`n_devices=N` splits the blocks",
        check_from_pretrained,
    ),
    "hooked.models.hooked_transformer.HookedTransformer.to": ("nothing is printed", check_to),
    "hooked.models.hooked_transformer.HookedTransformer.forward": ("taken as token embeddings", check_forward),
    "hooked.models.tokenizer_mixin.TokenizerMixin.to_tokens": ("never a double BOS", check_to_tokens),
    "hooked.core.hook_points.HookedRootModule.add_hook": ("`HookNotEnabledError` naming the flag", check_add_hook),
    "hooked.models.hooked_transformer.HookedTransformer.run_with_cache": ("unknown exact names", check_run_with_cache),
    "hooked.models.hooked_transformer.HookedTransformer.generate": ("also `generate_stream`", check_generate),
    "hooked.analysis.activation_cache.ActivationCache": (
        "also stores `tokens` and `attention_mask`",
        check_activation_cache,
    ),
    "hooked.analysis.activation_cache.ActivationCache.__contains__": ('`("pattern", 0) in cache`', check_contains),
    "hooked.analysis.patching.generic_activation_patch": (
        "a tqdm progress bar counts the patches",
        check_generic_activation_patch,
    ),
    "hooked.analysis.patching.get_act_patch_resid_pre": (
        "results equal TL's one forward per patch",
        check_get_act_patch_resid_pre,
    ),
    "hooked.analysis.patching.get_act_patch_attn_head_out_by_pos": ("`[L,p,Hkv]` under GQA", check_head_by_pos),
    "hooked.analysis.patching.get_act_patch_attn_head_pattern_by_pos": ("automatic batch size", check_pattern_by_pos),
    "hooked.analysis.patching.get_act_patch_attn_head_out_all_pos": ("`[L,Hkv]` under GQA", check_head_all_pos),
    "hooked.analysis.patching.get_act_patch_attn_head_all_pos_every": ("zero-padded from Hkv to H", check_every),
    "hooked.analysis.head_detector.detect_head": ("never the cached tensor", check_detect_head),
    "hooked.core.factored_matrix.FactoredMatrix.Vh": ("`DeprecationWarning`", check_vh),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.decompose_resid": (
        "a shortformer's `pos_embed` is no component",
        check_decompose_resid,
    ),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.get_full_resid_decomposition": (
        "no `pos_embed` component for a shortformer",
        check_full_resid_decomposition,
    ),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.stack_head_results": (
        "the `remainder` is the stream entering layer 0",
        check_stack_head_results,
    ),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.stack_neuron_results": (
        "an int `neuron_slice` takes that neuron of each layer",
        check_stack_neuron_results,
    ),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.apply_ln_to_stack": (
        "a stack scaled already (`apply_ln=True`) raises",
        check_apply_ln_to_stack,
    ),
    "hooked.analysis.cache_analysis.CacheAnalysisMixin.logit_attrs": (
        "it multiplies the token directions",
        check_logit_attrs,
    ),
    "hooked.core.factored_matrix.FactoredMatrix.eigenvalues": ("upcast before `eig`", check_eigenvalues),
}


def differs_rows() -> dict[str, str]:
    found = {}
    for hooked_cell, status in table_rows():
        paths = PATH.findall(hooked_cell)
        if paths and status.lstrip("*").startswith("differs"):
            found[paths[0]] = status
    return found


def test_every_differs_row_has_a_behaviour_check():
    unchecked = sorted(set(differs_rows()) - set(BEHAVIOURS))
    assert not unchecked, f"differs rows with no check in BEHAVIOURS ({__file__}): {unchecked}"
    stale = sorted(set(BEHAVIOURS) - set(differs_rows()))
    assert not stale, f"BEHAVIOURS checks rows that are no longer `differs` rows: {stale}"


@pytest.mark.parametrize("path", sorted(BEHAVIOURS))
def test_differs_row_behaves_as_stated(path, gpt2, gqa, capsys):
    phrase, check = BEHAVIOURS[path]
    status = differs_rows().get(path, "")
    assert phrase in status, f"the {path} row no longer says {phrase!r}: update the row or its check"
    check(gpt2, gqa, capsys)
