"""Path patching against a hand-written hook implementation of the IOI paper's procedure."""

import pytest
import torch

from hooked.circuits import path_patching
from tests.helpers import logit_diff
from tests.tiny_models import tiny_hooked, token_pair

torch.set_num_threads(1)

RECEIVER_HOOKS = {"q": "hook_q_input", "k": "hook_k_input", "v": "hook_v_input"}


def _expand(receivers):
    """A head "a{l}.h{h}" receives through its q, k and v."""
    out = []
    for r in receivers:
        is_head = r.startswith("a") and r.count(".") == 1
        out += [f"{r}.{k}" for k in "qkv"] if is_head else [r]
    return out


def hand_path_patch(model, clean, corrupted, senders, receivers):
    """Step 1: clean run, sender heads/MLPs/input from corrupted, every other head and MLP frozen
    to clean; record the receivers' inputs. Step 2: clean run with those inputs patched in."""
    receivers = _expand(receivers)
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def freeze_z(z, hook):
        layer = hook.layer()
        for h in range(H):
            source = corrupted_cache if f"a{layer}.h{h}" in senders else clean_cache
            z[:, :, h] = source[hook.name][:, :, h]

    def freeze_mlp(out, hook):
        source = corrupted_cache if f"m{hook.layer()}" in senders else clean_cache
        out[:] = source[hook.name]

    def freeze_input(resid, hook):
        resid[:] = (corrupted_cache if "input" in senders else clean_cache)[hook.name]

    recorded = {}

    def record(act, hook):
        recorded[hook.name] = act.detach().clone()

    receiver_points = [f"blocks.{layer}.{h}" for layer in range(L) for h in RECEIVER_HOOKS.values()]
    receiver_points += [f"blocks.{layer}.hook_mlp_in" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    freeze = [("blocks.0.hook_resid_pre", freeze_input)]
    freeze += [(f"blocks.{layer}.attn.hook_z", freeze_z) for layer in range(L)]
    freeze += [(f"blocks.{layer}.hook_mlp_out", freeze_mlp) for layer in range(L)]

    def patch(act, hook):
        layer = hook.layer()
        for r in receivers:
            if (
                r == "logits"
                and hook.name == f"blocks.{L - 1}.hook_resid_post"
                or r == f"m{layer}"
                and hook.name.endswith("hook_mlp_in")
            ):
                act[:] = recorded[hook.name]
            elif r.startswith(f"a{layer}.h") and hook.name.endswith(RECEIVER_HOOKS[r[-1]]):
                h = int(r.split(".")[1][1:])
                act[:, :, h] = recorded[hook.name][:, :, h]

    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.set_ungroup_grouped_query_attention(True)
    try:
        model.run_with_hooks(clean, fwd_hooks=freeze + [(n, record) for n in receiver_points])
        return logit_diff(model.run_with_hooks(clean, fwd_hooks=[(n, patch) for n in receiver_points])).item()
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
        model.set_ungroup_grouped_query_attention(False)


SENDER_SETS = [["a0.h1"], ["a0.h3", "m0"], ["input"], ["a1.h0", "a0.h2"], ["m1"]]
RECEIVER_SETS = [["a1.h2.q"], ["a1.h0.k", "a1.h3.v", "m1"], ["logits"], ["a1.h1", "logits"]]


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
@pytest.mark.parametrize("receivers", RECEIVER_SETS, ids=lambda r: "+".join(r))
def test_path_patching_equals_the_hand_written_hooks(family, receivers):
    model = tiny_hooked(family)
    clean, corrupted = token_pair(positions=(1, 2, 4))
    got = path_patching(model, clean, corrupted, logit_diff, SENDER_SETS, receivers, sets_per_forward=2)
    expected = torch.tensor([hand_path_patch(model, clean, corrupted, s, receivers) for s in SENDER_SETS])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert (got - logit_diff(model(clean))).abs().max() > 1e-4  # the patch does something


def test_senders_downstream_of_every_receiver_change_nothing():
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    got = path_patching(model, clean, corrupted, logit_diff, [["a1.h0"], ["m1"]], ["a1.h2.q", "m0"])
    with torch.no_grad():
        torch.testing.assert_close(got, logit_diff(model(clean)).repeat(2), atol=1e-6, rtol=0)


def test_unknown_names_are_refused():
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    with pytest.raises(ValueError, match="unknown sender"):
        path_patching(model, clean, corrupted, logit_diff, [["a9.h0"]], ["logits"])
    with pytest.raises(ValueError, match="unknown receiver"):
        path_patching(model, clean, corrupted, logit_diff, [["a0.h0"]], ["a1.h0.x"])
    with pytest.raises(ValueError, match="sender sets"):
        path_patching(model, clean, corrupted, logit_diff, "a0.h0", ["logits"])
