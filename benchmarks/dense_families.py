"""Forward speed of the dense families of issue 37 (MPT, CodeGen, XGLM, HunYuan, Gemma 4, Gemma 3n) vs HF, one run.

Each row is a randomly initialised model of the family at one shape, d_model 512, 8 heads of 64, MLP 2048
(Gemma 3n and 4 at Gemma's head width 64 with Gemma 4's global layers at 128), vocabulary 32000, 4
layers (Gemma 4: 6, five sliding to one global pattern cut short: sliding, sliding, global, sliding,
sliding, global; Gemma 3n: sliding, global, sliding, global), the last two of the Gemma models
reusing earlier layers' keys and values, per-layer inputs of width 64, Gemma 3n with 4 AltUp streams,
LAuReL rank 64 and sparse gates (0.95) on its first two layers. HF runs with its default (SDPA)
attention, hooked unprocessed; batch 4 x 128 tokens, float32, CPU, no grad. Each repeat times every
variant once, interleaved (`benchmarks/forward.py`'s `measure`), and the script prints medians and
ratios to HF's forward; the bound beside them is the project's: forward within 1.10x, caching every
hook within 1.3x.

    python benchmarks/dense_families.py [--repeats 7] [--threads N] [--clock cpu] [--only mpt,gemma4]
"""

from __future__ import annotations

import forward
import torch
from _machine import apply_machine_options, machine_parser
from forward import bench

D = dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8, vocab_size=32000)
SLIDING, GLOBAL = "sliding_attention", "full_attention"


def _gemma(**overrides) -> dict:
    kw = dict(D, num_key_value_heads=2, head_dim=64, hidden_size_per_layer_input=64, vocab_size_per_layer_input=32000)
    kw.update(max_position_embeddings=4096, sliding_window=64, num_kv_shared_layers=2, **overrides)
    return kw


#: name -> (HF class prefix, config kwargs)
FAMILIES = {
    "mpt": ("Mpt", dict(d_model=512, n_heads=8, n_layers=4, max_seq_len=2048, vocab_size=32000)),
    "codegen": ("CodeGen", dict(n_embd=512, n_head=8, n_inner=2048, n_layer=4, rotary_dim=32, vocab_size=32000)),
    "xglm": ("XGLM", dict(d_model=512, attention_heads=8, ffn_dim=2048, num_layers=4, vocab_size=32000)),
    "hunyuan": ("HunYuanDenseV1", dict(D, num_hidden_layers=4, num_key_value_heads=2, head_dim=64)),
    "gemma4": (
        "Gemma4",
        _gemma(num_hidden_layers=6, global_head_dim=128, layer_types=[SLIDING, SLIDING, GLOBAL] * 2),
    ),
    "gemma3n": (
        "Gemma3n",
        _gemma(
            num_hidden_layers=4, layer_types=[SLIDING, GLOBAL] * 2, laurel_rank=64, altup_num_inputs=4,
            activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
        ),
    ),
}  # fmt: skip


def build(name: str):
    import transformers

    from hooked import HookedTransformer

    prefix, kwargs = FAMILIES[name]
    config_cls = getattr(transformers, prefix + ("TextConfig" if prefix.startswith("Gemma") else "Config"))
    torch.manual_seed(0)
    hf = getattr(transformers, prefix + "ForCausalLM")(config_cls(**kwargs)).eval()
    return hf, HookedTransformer.from_pretrained_no_processing(name, hf_model=hf)


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=7)
    parser.add_argument("--clock", choices=sorted(forward.CLOCKS), default="wall")
    parser.add_argument("--only", default=None, help="comma-separated rows (mpt, codegen, xglm, hunyuan, gemma4, ...)")
    args = parser.parse_args()
    apply_machine_options(args)
    forward.clock = forward.CLOCKS[args.clock]
    tokens = torch.randint(3, 32000, (4, 128), generator=torch.Generator().manual_seed(0))
    print("bound: forward <= 1.10x HF, run_with_cache (all hooks) <= 1.30x HF")
    for name in args.only.split(",") if args.only else FAMILIES:
        hf, model = build(name)
        bench(f"{name} ({FAMILIES[name][0]}, random init)", hf, model, tokens, args.repeats)
        del hf, model


if __name__ == "__main__":
    main()
