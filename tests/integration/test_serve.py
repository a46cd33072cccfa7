"""`hooked serve` + `hooked.remote`: every client call equals the local model's.

Each tiny model (GPT-2, a GQA Llama) is served from a thread of this process on a free
127.0.0.1 port; the client talks HTTP to it. The server runs the same code on the same
weights, so results are compared bitwise (`torch.equal`).
"""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer, metrics, remote
from hooked import interventions as iv
from hooked.analysis import patching
from hooked.circuits import attribution_patch
from hooked.serve import start_in_thread
from tests.integration.serve_models import TOKENS, save_tiny

PROMPTS = ["The quick brown fox jumps", "When Mary and John went to"]


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa"])
def pair(request, tmp_path_factory):
    directory = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    local = HookedTransformer.from_pretrained(str(directory))
    served = HookedTransformer.from_pretrained(str(directory))
    server = start_in_thread(served, tokens=TOKENS)
    client = remote.connect(server.url, token=TOKENS["alice"])
    yield local, client
    client.close()
    server.stop()


def test_config_and_tokenizer_mirror_the_model(pair):
    local, client = pair
    assert client.cfg.to_dict() == {**local.cfg.to_dict(), "device": client.cfg.device}
    assert list(client.hook_dict) == list(local.hook_dict)
    assert torch.equal(client.to_tokens(PROMPTS), local.to_tokens(PROMPTS))
    assert client.to_str_tokens(PROMPTS[0]) == local.to_str_tokens(PROMPTS[0])
    assert client.to_string(local.to_tokens(PROMPTS[1])[0]) == local.to_string(local.to_tokens(PROMPTS[1])[0])


def test_forward_is_bitwise_equal(pair):
    local, client = pair
    tokens = local.to_tokens(PROMPTS)
    assert torch.equal(client(tokens), local(tokens))
    assert torch.equal(client(PROMPTS[0]), local(PROMPTS[0]))


def test_forward_takes_the_local_signature_and_returns_the_local_types(pair):
    from hooked.core.errors import InputError

    local, client = pair
    tokens = local.to_tokens(PROMPTS)
    for args, kwargs in [((tokens, "loss"), {}), ((tokens,), {"return_type": "both", "loss_per_token": True})]:
        got, expected = client(*args, **kwargs), local(*args, **kwargs)
        assert type(got) is type(expected)
        as_list = lambda x: list(x) if isinstance(x, tuple) else [x]  # noqa: E731
        assert all(torch.equal(a, b) for a, b in zip(as_list(got), as_list(expected), strict=True))
    assert client(PROMPTS[0], return_type=None) is None
    _, cache = client.run_with_cache(tokens, "loss", names_filter="blocks.0.hook_resid_post")
    assert torch.equal(_, local.run_with_cache(tokens, "loss", names_filter="blocks.0.hook_resid_post")[0])
    with pytest.raises(InputError, match="cannot take start_at_layer"):
        client(tokens, start_at_layer=1)


def _course_hooks(model):
    """A course script's interventions: every kind, on several hook points."""
    d = model.cfg.d_model
    steer = torch.randn(d, generator=torch.Generator().manual_seed(3))
    _, cache = model.run_with_cache(list(reversed(PROMPTS)), names_filter="blocks.0.hook_resid_post")
    return [
        ("blocks.0.attn.hook_z", iv.zero_ablate(heads=[1, 2], positions=[-1])),
        ("blocks.0.hook_resid_post", iv.patch_cache(cache["blocks.0.hook_resid_post"], positions=[0, 1])),
        ("blocks.1.hook_resid_pre", iv.add(steer, scale=2.0, positions=[-2, -1]).then(iv.clamp(-3.0, 3.0))),
        ("blocks.1.attn.hook_pattern", iv.scale(0.5, heads=0)),
        ("blocks.1.hook_mlp_out", iv.project_out(steer, rows=[1])),
        ("blocks.1.attn.hook_v", iv.mean_ablate(heads=[0])),
        ("blocks.0.hook_mlp_out", iv.patch_prompt(0, rows=[1])),
        ("blocks.1.hook_resid_post", iv.resample_ablate(source_rows=[1, 0], positions=[3])),
    ]


def test_course_script_runs_unchanged_local_and_remote(pair):
    """The same function, given the local model or the client, returns equal results."""
    local, client = pair

    def script(model):
        tokens = model.to_tokens(PROMPTS)
        hooks = _course_hooks(model)
        patched = model.run_with_hooks(tokens, fwd_hooks=hooks)
        with model.hooks(fwd_hooks=hooks[:2]):
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("resid_post", "hook_z")))
        return patched, logits, cache["blocks.1.hook_resid_post"], cache["blocks.0.attn.hook_z"]

    for got, expected in zip(script(client), script(local), strict=True):
        assert torch.equal(got, expected)


def test_cache_analysis_reads_fetched_weights(pair):
    local, client = pair
    _, remote_cache = client.run_with_cache(PROMPTS)
    _, local_cache = local.run_with_cache(PROMPTS)
    assert set(remote_cache.keys()) == set(local_cache.keys())
    for name in local_cache:
        assert torch.equal(remote_cache[name], local_cache[name]), name
    for fn in (
        lambda c: c.accumulated_resid(apply_ln=True),
        lambda c: c.decompose_resid(apply_ln=True),
        lambda c: c.stack_head_results(apply_ln=True),
        lambda c: c.stack_neuron_results(layer=1),
        lambda c: c.logit_attrs(c.decompose_resid(), tokens=5),
        lambda c: c.logit_lens(),
    ):
        torch.testing.assert_close(fn(remote_cache), fn(local_cache), rtol=0, atol=0)


def test_generate_greedy_with_hooks_at_steps_and_cache(pair):
    local, client = pair
    kw = dict(max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
    assert client.generate(PROMPTS[0], **kw) == local.generate(PROMPTS[0], **kw)
    hooks = lambda: [("blocks.0.hook_resid_post", iv.zero_ablate(steps=[2, 3], positions=[-1]))]  # noqa: E731
    tokens = local.to_tokens(PROMPTS[1])
    got = client.generate(tokens, fwd_hooks=hooks(), **kw)
    expected = local.generate(tokens, fwd_hooks=hooks(), **kw)
    assert torch.equal(got, expected) and not torch.equal(got, local.generate(tokens, **kw))
    out_r = client.generate(
        PROMPTS, return_cache=True, names_filter="blocks.1.hook_resid_post", output_logits=True, **kw
    )
    out_l = local.generate(
        PROMPTS, return_cache=True, names_filter="blocks.1.hook_resid_post", output_logits=True, **kw
    )
    assert torch.equal(out_r.sequences, out_l.sequences) and out_r.text == out_l.text
    assert torch.equal(out_r.cache["blocks.1.hook_resid_post"], out_l.cache["blocks.1.hook_resid_post"])
    assert all(torch.equal(a, b) for a, b in zip(out_r.logits, out_l.logits, strict=True))


def test_generate_streams_each_step(pair):
    local, client = pair
    kw = dict(max_new_tokens=5, do_sample=True, seed=7, verbose=False, stop_at_eos=False)
    events = []
    sampled = client.generate(PROMPTS[0], on_token=events.append, **kw)
    assert sampled == local.generate(PROMPTS[0], **kw)
    assert [e["step"] for e in events] == list(range(5))
    chunks = list(client.generate_stream(local.to_tokens(PROMPTS[1]), **kw))
    assert torch.equal(torch.cat(chunks, 1), local.generate(local.to_tokens(PROMPTS[1]), **kw)[:, -5:])


def _drain(stream):
    chunks = []
    while True:
        try:
            chunks.append(next(stream))
        except StopIteration as done:
            return chunks, done.value


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("kind", ["str", "list", "tokens"])
def test_generate_stream_is_the_local_stream(pair, kind):
    """The same call, with docs/generation.md's keywords, yields the same chunks (text for text) and returns
    the same result on the local model and the client."""
    local, client = pair
    prompt = {"str": PROMPTS[0], "list": PROMPTS, "tokens": local.to_tokens(PROMPTS[1])}[kind]
    kw = dict(max_new_tokens=5, temperature=0, max_tokens_per_yield=2, verbose=False, stop_at_eos=False)
    (got, got_result), (expected, expected_result) = (_drain(m.generate_stream(prompt, **kw)) for m in (client, local))
    assert len(got) == len(expected) == 3
    assert all(_equal(a, b) for a, b in zip(got, expected, strict=True)), (got, expected)
    assert _equal(got_result, expected_result)


def test_generation_options_object_and_refusals(pair):
    from hooked.core.errors import InputError
    from hooked.generation.options import GenerationOptions

    local, client = pair
    greedy = GenerationOptions(max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)
    assert client.generate(PROMPTS[0], options=greedy) == local.generate(PROMPTS[0], options=greedy)
    with pytest.raises(InputError, match="seed= instead"):
        client.generate(PROMPTS[0], generator=torch.Generator())
    with pytest.raises(InputError, match="disagree"):  # the local rule: each setting once
        client.generate(PROMPTS[0], max_new_tokens=7, options=greedy)
    with pytest.raises(TypeError, match="unexpected keyword"):  # the local signature, not **kwargs
        client.generate(PROMPTS[0], max_tokens=3)


@pytest.mark.parametrize(
    "fn",
    [
        "get_act_patch_resid_pre",
        "get_act_patch_attn_head_out_all_pos",
        "get_act_patch_attn_head_v_by_pos",
        "get_act_patch_block_every",
    ],
)
def test_patching_sweeps_run_server_side(pair, fn):
    local, client = pair
    clean = local.to_tokens(PROMPTS[0])
    corrupted = torch.cat([clean[:, :1], clean[:, 1:].flip(1)], dim=1)  # same length, other order
    metric = metrics.logit_diff([5, 6], [7])
    _, clean_cache_r = client.run_with_cache(clean)
    _, clean_cache_l = local.run_with_cache(clean)
    got = getattr(patching, fn)(client, corrupted, clean_cache_r, metric, verbose=False)
    expected = getattr(patching, fn)(local, corrupted, clean_cache_l, metric, verbose=False)
    assert torch.equal(got, expected)


def test_generic_patch_with_index_rows_and_log_prob_metric(pair):
    local, client = pair
    clean = local.to_tokens(PROMPTS[0])
    corrupted = clean.flip(1)
    rows = torch.tensor([[1, 0], [0, 3], [1, 2]])
    metric = metrics.log_prob(9)
    args = (patching.layer_pos_patch_setter, "resid_mid")
    got = patching.generic_activation_patch(
        client, corrupted, client.run_with_cache(clean)[1], metric, *args, index_df=rows, verbose=False
    )
    expected = patching.generic_activation_patch(
        local, corrupted, local.run_with_cache(clean)[1], metric, *args, index_df=rows, verbose=False
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize("method", ["atp", "ig"])
def test_attribution_patch_runs_server_side(pair, method):
    local, client = pair
    clean = local.to_tokens(PROMPTS)
    corrupted = clean.roll(1, dims=0)
    metric = metrics.projection(torch.randn(local.cfg.d_vocab_out, generator=torch.Generator().manual_seed(0)))
    names = lambda n: n.endswith(("hook_resid_pre", "hook_z"))  # noqa: E731
    got = attribution_patch(client, clean, corrupted, metric, names, method=method, steps=4)
    expected = attribution_patch(local, clean, corrupted, metric, names, method=method, steps=4)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_python_hooks_and_metrics_are_refused_client_side(pair):
    _, client = pair
    with pytest.raises(Exception, match="never Python functions"):
        client.run_with_hooks(PROMPTS[0], fwd_hooks=[("blocks.0.hook_resid_pre", lambda act, hook: act)])
    with pytest.raises(Exception, match="hooked.analysis.metrics"):
        patching.get_act_patch_resid_pre(
            client,
            client.to_tokens(PROMPTS[0]),
            client.run_with_cache(PROMPTS[0])[1],
            lambda logits: logits.sum(),
            verbose=False,
        )


@pytest.mark.slow
def test_bundled_smollm2_remote_equals_local():
    """The course script, generation and a patching sweep on the real bundled model, bitwise."""
    local = HookedTransformer.from_pretrained("smollm2-135m")
    served = HookedTransformer.from_pretrained("smollm2-135m")
    with start_in_thread(served, tokens=TOKENS) as server, remote.connect(server.url, token=TOKENS["bob"]) as client:
        prompt = "The Eiffel Tower is in the city of"
        paris, rome = local.to_single_token(" Paris"), local.to_single_token(" Rome")
        steer = local.W_U[:, paris] - local.W_U[:, rome]
        hooks = [
            ("blocks.10.attn.hook_z", iv.zero_ablate(heads=[0, 3])),
            ("blocks.20.hook_resid_post", iv.add(steer, scale=-4.0, positions=[-1])),
        ]
        for model_pair in [(client, local)]:
            got, expected = (m.run_with_hooks(prompt, fwd_hooks=hooks) for m in model_pair)
            assert torch.equal(got, expected)
        (lr, cr), (ll, cl) = (
            m.run_with_cache(prompt, names_filter=lambda n: "resid" in n or "scale" in n) for m in (client, local)
        )
        assert torch.equal(lr, ll)
        torch.testing.assert_close(
            cr.accumulated_resid(apply_ln=True), cl.accumulated_resid(apply_ln=True), rtol=0, atol=0
        )
        kw = dict(max_new_tokens=8, do_sample=False, verbose=False)
        assert client.generate(prompt, **kw) == local.generate(prompt, **kw)
        metric = metrics.logit_diff(paris, rome)
        corrupted = local.to_tokens("The Colosseum is in the city of")
        clean = local.to_tokens(prompt)
        assert clean.shape == corrupted.shape
        got = patching.get_act_patch_resid_pre(
            client, corrupted, client.run_with_cache(clean)[1], metric, verbose=False
        )
        expected = patching.get_act_patch_resid_pre(
            local, corrupted, local.run_with_cache(clean)[1], metric, verbose=False
        )
        assert torch.equal(got, expected)
