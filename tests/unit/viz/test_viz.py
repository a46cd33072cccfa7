"""hooked.viz: the data each view embeds in its page equals what the model and cache hold."""

import re

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.analysis.inspection import top_heads
from hooked.core.errors import InputError
from hooked.viz import (
    View,
    activations_over_text,
    attention_patterns,
    direct_logit_attribution,
    embedded_data,
    logit_lens,
)
from hooked.viz.report import prompt_views

torch.set_num_threads(1)

PROMPT = "When Mary and John went to the store, John gave a drink to"
EXACT = dict(atol=0, rtol=0)  # JSON holds float64: float32 values round-trip exactly
CLOSE = dict(atol=1e-5, rtol=1e-5)  # docs/numerics.md#tolerances: tiny models


@pytest.fixture(scope="module")
def model(tokenizer):
    cfg = HookedTransformerConfig(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=2,
        n_ctx=64,
        d_vocab=len(tokenizer),
        d_mlp=64,
        act_fn="gelu",
        normalization_type="LNPre",
        seed=0,
    )
    m = HookedTransformer(cfg, tokenizer=tokenizer)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("b"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return m.eval()


@pytest.fixture(scope="module")
def run(model):
    tokens = model.to_tokens(PROMPT)
    logits, cache = model.run_with_cache(tokens)
    return tokens, logits, cache


def roundtrip(view: View) -> dict:
    """The view's data as the browser receives it: parsed back from the saved page."""
    (data,) = embedded_data(view.html)
    return data


def test_attention_embeds_the_cached_patterns_and_token_labels(model, run):
    tokens, _, cache = run
    data = roundtrip(attention_patterns(model, cache, 1, heads=[3, 0]))
    assert data["tokens"] == model.to_str_tokens(tokens[0])
    assert data["heads"] == ["L1H3", "L1H0"]
    torch.testing.assert_close(
        torch.tensor(data["patterns"], dtype=torch.float64), cache["pattern", 1][0, [3, 0]].double(), **EXACT
    )
    assert data["notes"] == []


def test_attention_caps_heads_and_positions_and_says_so(model, run):
    _, _, cache = run
    n = cache["pattern", 0].shape[-1]
    data = roundtrip(attention_patterns(model, cache, 0, max_pos=5, max_heads=2))
    assert data["heads"] == ["L0H0", "L0H1"] and data["positions"] == list(range(n - 5, n))
    torch.testing.assert_close(
        torch.tensor(data["patterns"], dtype=torch.float64), cache["pattern", 0][0, :2, -5:, -5:].double(), **EXACT
    )
    assert any("2 of 4 heads" in note for note in data["notes"])
    assert any(f"last 5 of {n} positions" in note for note in data["notes"])


def test_attention_labels_from_strings_and_errors(model, run):
    _, _, cache = run
    n = cache["pattern", 0].shape[-1]
    labels = [f"t{i}" for i in range(n)]
    assert roundtrip(attention_patterns(labels, cache, -1))["tokens"] == labels
    with pytest.raises(InputError, match=r"layer=2 is outside the model's layers \[0, 2\)"):
        attention_patterns(model, cache, 2)
    with pytest.raises(InputError, match=r"heads \[4\] are outside"):
        attention_patterns(model, cache, 0, heads=[4])
    with pytest.raises(InputError, match="3 token labels for a cache of"):
        attention_patterns(["a", "b", "c"], cache, 0)


def lens_logits(model, cache) -> torch.Tensor:
    """Each layer's residual stream through ln_final and the unembedding, computed here from the hooks."""
    resids = [cache["resid_pre", layer_i][0] for layer_i in range(model.cfg.n_layers)] + [cache["resid_post", -1][0]]
    return torch.stack([model.unembed(model.ln_final(r[None]))[0] for r in resids])  # [layer, pos, vocab]


def test_logit_lens_probabilities_of_a_fixed_target(model, run):
    _, logits, cache = run
    target = " Mary"
    target_id = model.to_single_token(target)
    data = roundtrip(logit_lens(model, cache, target=target))
    expected = lens_logits(model, cache).softmax(-1)[..., target_id]  # [layer, pos]
    torch.testing.assert_close(torch.tensor(data["values"]).float(), expected, **CLOSE)
    assert data["layers"] == ["0_pre", "1_pre", "final_post"]
    assert set(data["target_ids"]) == {target_id} and set(data["targets"]) == {target}
    # the last row is the model's own prediction
    torch.testing.assert_close(torch.tensor(data["values"][-1]).float(), logits[0].softmax(-1)[:, target_id], **CLOSE)
    top = lens_logits(model, cache).softmax(-1).max(-1)
    assert data["top_ids"] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(data["top_probs"]).float(), top.values, **CLOSE)
    assert data["top_tokens"][0][0] == model.to_single_str_token(int(top.indices[0, 0]))


def test_logit_lens_ranks_of_each_positions_prediction(model, run):
    _, logits, cache = run
    data = roundtrip(logit_lens(model, cache, mode="rank"))
    predicted = logits[0].argmax(-1)  # [pos]
    assert data["target_ids"] == predicted.tolist()
    lens = lens_logits(model, cache)
    target_logit = lens.gather(-1, predicted[None, :, None].expand(lens.shape[0], -1, 1))
    assert data["values"] == (lens > target_logit).sum(-1).tolist()
    assert data["values"][-1] == [0] * len(predicted)


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_logit_lens_caps_positions(model, run):
    _, _, cache = run
    data = roundtrip(logit_lens(model, cache, target=5, max_pos=3))
    n = cache["resid_pre", 0].shape[1]
    assert data["positions"] == [n - 3, n - 2, n - 1] and len(data["values"][0]) == 3
    expected = lens_logits(model, cache)[:, -3:].softmax(-1)[..., 5]
    torch.testing.assert_close(torch.tensor(data["values"]).float(), expected, **CLOSE)
    assert "last 3 of" in data["notes"][0]
    with pytest.raises(InputError, match="mode='logit'"):
        logit_lens(model, cache, mode="logit")


def test_dla_per_layer_sums_to_the_logit_difference(model, run):
    """With LNPre the final norm has no weights, so the components add up to logit - b_U."""
    _, logits, cache = run
    a, b = model.to_single_token(" Mary"), model.to_single_token(" John")
    data = roundtrip(direct_logit_attribution(model, cache, " Mary", " John", per="layer"))
    assert set(data["labels"]) == {"embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"}
    expected = (logits[0, -1, a] - model.b_U[a]) - (logits[0, -1, b] - model.b_U[b])
    torch.testing.assert_close(torch.tensor(sum(data["values"])).float(), expected, **CLOSE)
    assert data["values"] == sorted(data["values"], reverse=True)
    assert "' Mary'" in data["title"] and "' John'" in data["title"]


def test_dla_per_head_is_each_heads_write_through_the_final_scale(model, run):
    _, _, cache = run
    a = model.to_single_token(" John")
    data = roundtrip(direct_logit_attribution(model, cache, a, per="head", pos=4))
    scale = cache["ln_final.hook_scale"][0, 4]
    got = dict(zip(data["labels"], data["values"], strict=True))
    assert len(got) == model.cfg.n_layers * model.cfg.n_heads
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            write = cache["z", layer][0, 4, h] @ model.blocks[layer].attn.W_O[h]  # [d_model]
            expected = (write - write.mean()) / scale @ model.W_U[:, a]
            torch.testing.assert_close(torch.tensor(got[f"L{layer}H{h}"]).float(), expected, **CLOSE)


def test_dla_caps_bars(model, run):
    _, _, cache = run
    full = roundtrip(direct_logit_attribution(model, cache, 7, per="head"))
    top = roundtrip(direct_logit_attribution(model, cache, 7, per="head", max_bars=3))
    largest = sorted(zip(full["labels"], full["values"], strict=True), key=lambda lv: -abs(lv[1]))[:3]
    assert sorted(top["labels"]) == sorted(label for label, _ in largest)
    assert "3 largest of 8" in top["notes"][0]


def test_text_view_embeds_the_values(model, run):
    tokens, _, cache = run
    str_tokens = model.to_str_tokens(tokens[0])
    neuron = cache["post", 0][0, :, 3]
    data = roundtrip(activations_over_text(str_tokens, neuron))
    assert data["tokens"] == str_tokens
    torch.testing.assert_close(torch.tensor(data["values"], dtype=torch.float64), neuron.double(), **EXACT)
    with pytest.raises(InputError, match="2 tokens but 3 values"):
        activations_over_text(["a", "b"], [1.0, 2.0, 3.0])


def test_page_is_self_contained_and_escapes_script_text(tmp_path):
    tokens = ["</script><script>alert(1)</script>", "&amp;", "\n"]
    view = activations_over_text(tokens, [float("nan"), -1.0, 2.0])
    page = view.save(tmp_path / "v.html").read_text()
    assert page.count("</script>") == 2  # the JSON block and the renderer, nothing from the data
    assert not re.search(r"(src|href)\s*=|https?://|@import", page)
    (data,) = embedded_data(page)
    assert data["tokens"] == tokens and data["values"] == [None, -1.0, 2.0]
    assert view._repr_html_().startswith('<div class="hv"')


def test_prompt_views_has_every_kind(model, run):
    tokens, logits, cache = run
    lens, attention, heads, layers, text = embedded_data(prompt_views(model, PROMPT).html)
    assert [lens["kind"], attention["kind"], heads["kind"], layers["kind"], text["kind"]] == [
        "logit_lens",
        "attention",
        "bars",
        "bars",
        "text",
    ]
    # the attention layer holds the head attending most sharply from the last position (first token excluded)
    sharpest = torch.stack(
        [cache["pattern", layer_i][0, :, -1, 1:].max(-1).values for layer_i in range(2)]
    )  # [layer, head]
    assert attention["layer"] == int(sharpest.flatten().argmax()) // model.cfg.n_heads
    answer = int(logits[0, -1].argmax())
    assert heads["answer_id"] == layers["answer_id"] == answer and (heads["per"], layers["per"]) == ("head", "layer")
    log_probs = logits[0, :-1].log_softmax(-1).gather(-1, tokens[0, 1:, None])[:, 0]
    assert text["values"][0] is None
    torch.testing.assert_close(torch.tensor(text["values"][1:]), log_probs, **CLOSE)


def test_the_views_say_what_they_show(model, run):
    _, _, cache = run
    lens = roundtrip(logit_lens(model, cache))
    assert lens["layer_help"] == [
        "the residual stream entering layer 0", "the residual stream entering layer 1",
        "the residual stream after the last layer: the model's output",
    ]  # fmt: skip
    assert "l_pre is the stream entering layer l" in lens["description"] and "in %" in lens["description"]
    assert "finally predicts next" in lens["description"]
    assert "the token asked for" in roundtrip(logit_lens(model, cache, target=" Mary"))["description"]
    assert "row = the query token" in roundtrip(attention_patterns(model, cache, 0))["description"]
    bars = roundtrip(direct_logit_attribution(model, cache, " Mary", " John", per="head"))
    assert (
        "one attention head writes" in bars["description"] and "logit of ' Mary' minus ' John'" in bars["description"]
    )


def test_prompt_views_attribute_a_logit_difference_and_say_why_the_layer(model, run):
    _, _, cache = run
    _, attention, heads, layers, _ = embedded_data(prompt_views(model, PROMPT, answer=" Mary", wrong=" John").html)
    mary, john = model.to_single_token(" Mary"), model.to_single_token(" John")
    for bars, per in ((heads, "head"), (layers, "layer")):
        assert (bars["answer_id"], bars["wrong_id"]) == (mary, john)
        want = roundtrip(direct_logit_attribution(model, cache, " Mary", " John", per=per))
        assert bars["labels"] == want["labels"] and bars["values"] == want["values"]
        assert "' Mary' minus ' John'" in bars["title"]
    head, weight, token = top_heads(model, cache, -1, model.to_str_tokens(PROMPT), k=1)[0]
    assert attention["description"].startswith(
        f"Layer {attention['layer']} is shown because its head {head} attends most sharply from the last token"
    )
    assert f"{weight:.0%} of its attention on {token!r}" in attention["description"]
    asked = embedded_data(prompt_views(model, PROMPT, layer=0).html)[1]
    assert asked["layer"] == 0 and asked["description"].startswith("Layer 0, as asked.")
    with pytest.raises(InputError, match="answer and wrong are the same token"):
        prompt_views(model, PROMPT, answer=" Mary", wrong=" Mary")
    with pytest.raises(InputError, match=r"layer=5 is outside the model's layers \[0, 2\)"):
        prompt_views(model, PROMPT, layer=5)
