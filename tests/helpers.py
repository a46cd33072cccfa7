"""Shared checks for tests: block outputs of an HF model, distances, circuit metrics, half-precision rows.

The tiny models themselves live in `tests/tiny_models.py`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

# Moved to tests/tiny_models.py; still importable here for branches written before the move.
from tests.tiny_models import CORPUS, NO_PROCESSING, hooked_from, make_tokenizer, tiny_gpt2  # noqa: F401


def hf_block_outputs(hf, blocks, *args, **kwargs) -> list[torch.Tensor]:
    """Run `hf(*args)` and return each decoder block's output hidden state."""
    outputs = []
    handles = [
        b.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o)) for b in blocks
    ]
    try:
        with torch.no_grad():
            hf(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return outputs


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- circuit metrics (on tests.tiny_models.tiny_hooked models) ---------------------------


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """A metric linear in the logits: last-position logit 3 minus logit 7, batch mean."""
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def right_padding_mask(batch: int, pos: int) -> torch.Tensor:
    """Each row one shorter than the last (row 0 full): `[batch, pos]` of 1s then 0s."""
    lengths = torch.tensor([pos - i for i in range(batch)])
    return (torch.arange(pos)[None] < lengths[:, None]).long()


def last_token_metric(mask: torch.Tensor):
    """Logit 3 minus logit 7 at each row's last real token (for right-padded batches)."""
    last = mask.sum(1) - 1

    def metric(logits: torch.Tensor) -> torch.Tensor:
        rows = logits[torch.arange(logits.shape[0]), last]  # [batch, d_vocab]
        return (rows[:, 3] - rows[:, 7]).mean()

    return metric


# -- half precision: hooked and HF against float32 (tests/acceptance/test_precision_parity.py, benchmarks/precision.py)


def _logprobs(x: torch.Tensor) -> torch.Tensor:
    return x.double().log_softmax(-1)


def _sdpa_logits(directory: Path, dtype: torch.dtype, tokens: torch.Tensor) -> torch.Tensor | None:
    from transformers import AutoModelForCausalLM

    try:
        hf = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa")
        hf = hf.to(tokens.device).eval()
    except ValueError:  # e.g. Gemma 2 (soft-capped scores): HF refuses SDPA
        return None
    with torch.no_grad():
        return hf(tokens).logits


def precision_rows(
    family: str, dtypes: list[torch.dtype], tokens: torch.Tensor, device: str | torch.device = "cpu"
) -> list[dict]:
    """Per dtype: max |Δ log_softmax| of hooked vs HF eager, HF eager vs SDPA (δ_HF), and each vs float32.

    δ_HF is defined in docs/numerics.md. `family` is a key of `tests.tiny_models.EVERY_FAMILY`.
    HF loads the saved float32 checkpoint with `from_pretrained(dtype=...)`, as users run it
    (rotary frequencies stay float32); hooked takes that HF model unprocessed, in that dtype,
    with eager attention as HF's (hooked's default SDPA path is compared with HF's SDPA by
    δ_HF's size). Both run on `device` (the checkpoint is built and saved on the CPU).
    """
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import EVERY_FAMILY

    hf32 = EVERY_FAMILY[family]()
    tokens = tokens.to(device)
    hf32.to(device)
    with torch.no_grad():
        fp32 = _logprobs(hf32(tokens).logits)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        hf32.save_pretrained(directory)
        for dtype in dtypes:
            hf = AutoModelForCausalLM.from_pretrained(Path(directory), dtype=dtype, attn_implementation="eager")
            hf = hf.to(device).eval()
            sdpa = _sdpa_logits(Path(directory), dtype, tokens)  # None: HF has no SDPA path for the family
            ours = hooked_from(hf, dtype=dtype, device=device)
            ours.cfg.attn_implementation = "eager"  # the same attention path as the HF reference
            with torch.no_grad():
                hf_logits, our_logits = hf(tokens).logits, ours(tokens)
            hf_lp, our_lp = _logprobs(hf_logits), _logprobs(our_logits)
            rows.append(
                dict(
                    family=family,
                    dtype=str(dtype).removeprefix("torch."),
                    bitwise=bool(torch.equal(hf_logits, our_logits)),
                    hooked_vs_hf=(our_lp - hf_lp).abs().max().item(),
                    hf_eager_vs_sdpa=None if sdpa is None else (_logprobs(sdpa) - hf_lp).abs().max().item(),
                    hf_vs_fp32=(hf_lp - fp32).abs().max().item(),
                    hooked_vs_fp32=(our_lp - fp32).abs().max().item(),
                )
            )
    return rows
