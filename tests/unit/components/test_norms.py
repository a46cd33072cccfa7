"""Norms: pre-gain hook_normalized, float32 statistics, and interventions on hook_scale."""

import pytest
import torch

from hooked import HookedTransformerConfig
from hooked.components.norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from hooked.core.hook_points import HookedRootModule

CFG = HookedTransformerConfig(d_model=16, d_head=4, n_layers=1, n_ctx=8, act_fn="relu", eps=1e-5)


class Root(HookedRootModule):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.setup()

    def forward(self, x):
        return self.norm(x)


def reference(kind, x, scale_override=None):
    centered = x - x.mean(-1, keepdim=True) if kind.startswith("LN") else x
    var = centered.pow(2).mean(-1, keepdim=True)
    scale = (var + CFG.eps).sqrt() if scale_override is None else scale_override
    return centered / scale, scale


@pytest.mark.parametrize("cls", [LayerNorm, LayerNormPre, RMSNorm, RMSNormPre])
def test_norm_values_and_scale_interventions(cls):
    kind = "LN" if "Layer" in cls.__name__ else "RMS"
    root = Root(cls(CFG))
    if hasattr(root.norm, "w"):
        with torch.no_grad():
            root.norm.w.uniform_(0.5, 1.5)
            if hasattr(root.norm, "b"):
                root.norm.b.uniform_(-1, 1)
    x = torch.randn(2, 5, 16) * 3 + 1
    out, cache = root.run_with_cache(x)
    normalized, scale = reference(kind, x)
    torch.testing.assert_close(cache["norm.hook_normalized"], normalized, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache["norm.hook_scale"], scale, atol=1e-6, rtol=1e-6)
    frozen = torch.full_like(scale, 2.0)
    replaced = root.run_with_hooks(x, fwd_hooks=[("norm.hook_scale", lambda s, hook: frozen)])
    in_place = root.run_with_hooks(x, fwd_hooks=[("norm.hook_scale", lambda s, hook: s.fill_(2.0))])
    expected, _ = reference(kind, x, frozen)
    gain = root.norm.w if hasattr(root.norm, "w") else 1.0
    bias = root.norm.b if hasattr(root.norm, "b") else 0.0
    torch.testing.assert_close(replaced, expected * gain + bias, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(in_place, replaced, atol=0, rtol=0)
    assert not torch.allclose(replaced, out)


def test_bf16_input_uses_float32_statistics():
    norm = RMSNormPre(CFG)
    x = (torch.randn(2, 3, 16) * 100).bfloat16()
    out = norm(x)
    assert out.dtype == torch.bfloat16
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + CFG.eps)
    torch.testing.assert_close(out, ref.bfloat16(), atol=0, rtol=0)


def test_backward_hook_on_scale_sees_the_gradient():
    root = Root(RMSNorm(CFG))
    x = torch.randn(2, 3, 16, requires_grad=True)
    grads = []
    root.add_hook("norm.hook_scale", lambda g, hook: grads.append(g), dir="bwd")
    root(x).sum().backward()
    assert len(grads) == 1 and grads[0].shape == (2, 3, 1)
    # reference: d(sum(w * x / s)) / ds = -sum(w * x) / s^2
    s = (x.detach().pow(2).mean(-1, keepdim=True) + CFG.eps).sqrt()
    ref = -(root.norm.w.detach() * x.detach()).sum(-1, keepdim=True) / s**2
    torch.testing.assert_close(grads[0], ref, atol=1e-5, rtol=1e-5)


def _half_layer_norm(dtype):
    """A LayerNorm in `dtype` with random gain and bias, inside a hookable root."""
    root = Root(LayerNorm(CFG.replace(dtype=dtype)))
    with torch.no_grad():
        root.norm.w.copy_(torch.rand(16) + 0.5)
        root.norm.b.copy_(torch.rand(16) * 2 - 1)
    return root


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layer_norm_is_one_fused_kernel_unless_a_hook_edits_it(dtype):
    root = _half_layer_norm(dtype)
    w, b = root.norm.w, root.norm.b
    x = (torch.randn(2, 5, 16) * 3 + 1).to(dtype)
    fused = torch.nn.functional.layer_norm(x, (16,), w, b, CFG.eps)  # HF's nn.LayerNorm: one rounding
    out, cache = root.run_with_cache(x)
    names = ("norm.hook_scale", "norm.hook_normalized")
    identity = root.run_with_hooks(x, fwd_hooks=[(n, lambda t, hook: t) for n in names])
    for result in (root(x), out, identity):
        torch.testing.assert_close(result, fused, atol=0, rtol=0)
    normalized = torch.nn.functional.layer_norm(x.float(), (16,), eps=CFG.eps)  # before the gain, cast once
    torch.testing.assert_close(cache["norm.hook_normalized"], normalized.to(dtype), atol=0, rtol=0)

    def ablate(t, hook):
        t[..., 0] = 0.0

    edited = cache["norm.hook_normalized"].clone()
    edited[..., 0] = 0.0
    ablated = root.run_with_hooks(x, fwd_hooks=[("norm.hook_normalized", ablate)])
    torch.testing.assert_close(ablated, torch.addcmul(b, edited, w), atol=0, rtol=0)
    torch.testing.assert_close(ablated[..., 0], b[0].expand(2, 5), atol=0, rtol=0)


def test_backward_hook_on_layer_norm_normalized_sees_the_gradient():
    root = Root(LayerNorm(CFG))
    with torch.no_grad():
        root.norm.w.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 16, requires_grad=True)
    grads = []
    root.add_hook("norm.hook_normalized", lambda g, hook: grads.append(g), dir="bwd")
    root(x).sum().backward()
    assert len(grads) == 1  # d(sum(n * w + b)) / dn = w
    torch.testing.assert_close(grads[0], root.norm.w.detach().expand(2, 3, 16), atol=0, rtol=0)


def _cohere_layer_norm(x, w, eps):
    """HF's `CohereLayerNorm.forward`, op by op (the reference the gain-first LayerNorm must equal)."""
    h = x.to(torch.float32)
    mean = h.mean(-1, keepdim=True)
    variance = (h - mean).pow(2).mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt(variance + eps)
    return (w.to(torch.float32) * h).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gain_first_layer_norm_is_cohere_bit_for_bit_and_hooks_stay_transparent(dtype):
    from hooked.components.norms import LayerNormGainFirst, make_norm

    cfg = CFG.replace(dtype=dtype, norm_gain_in_fp32=True)
    assert type(make_norm(cfg)) is LayerNormGainFirst
    root = Root(LayerNormGainFirst(cfg))
    with torch.no_grad():
        root.norm.w.copy_(torch.rand(16) + 0.5)  # bias-free, as Cohere's: b stays 0
    torch.manual_seed(0)
    x = (torch.randn(64, 64, 16) * 3 + 1).to(dtype)  # enough rows that the fused kernel rounds some differently
    expected = _cohere_layer_norm(x, root.norm.w, CFG.eps)
    assert not torch.equal(expected, torch.nn.functional.layer_norm(x, (16,), root.norm.w, None, CFG.eps))
    out, cache = root.run_with_cache(x)
    names = ("norm.hook_scale", "norm.hook_normalized")
    identity = root.run_with_hooks(x, fwd_hooks=[(n, lambda t, hook: t) for n in names])
    for result in (root(x), out, identity):
        torch.testing.assert_close(result, expected, atol=0, rtol=0)
    assert cache["norm.hook_normalized"].dtype == dtype and cache["norm.hook_scale"].dtype == torch.float32

    def ablate(t, hook):
        t[..., 0] = 0.0

    ablated = root.run_with_hooks(x, fwd_hooks=[("norm.hook_normalized", ablate)])
    edited = cache["norm.hook_normalized"].clone()  # an edited value is used as the hook left it (cast)
    edited[..., 0] = 0.0
    torch.testing.assert_close(ablated, (root.norm.w.float() * edited.float()).to(dtype), atol=0, rtol=0)
    torch.testing.assert_close(ablated[..., 0], torch.zeros(64, 64, dtype=dtype), atol=0, rtol=0)


def test_gain_first_layer_norm_in_float32_is_the_fused_layer_norm():
    from hooked.components.norms import LayerNormGainFirst

    norm = LayerNormGainFirst(CFG.replace(norm_gain_in_fp32=True))
    with torch.no_grad():
        norm.w.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 16) * 3 + 1
    torch.testing.assert_close(
        norm(x), torch.nn.functional.layer_norm(x, (16,), norm.w, norm.b, CFG.eps), atol=0, rtol=0
    )
