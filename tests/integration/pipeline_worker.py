"""One rank of the pipeline tests (tests/integration/test_pipeline.py starts a world of these).

`python pipeline_worker.py OUT_DIR SCENARIO=MODEL_DIR[,MODEL_DIR...] ...` runs the scenarios in order;
the rank and world come from torchrun's environment variables. Each scenario saves what it saw to
`OUT_DIR/<model>_rank<r>.pt`; the test process compares that with the single-process model.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from hooked import HookedTransformer
from hooked.analysis.patching import get_act_patch_resid_pre
from hooked.scale.collectives import PipelineError
from hooked.scale.pipeline import PipelineTransformer

TIMEOUT_S = 60.0


def prompt_tokens(vocab: int, batch: int = 4, pos: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab - 3, (batch, pos), generator=torch.Generator().manual_seed(seed))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[0, -1, 5] - logits[0, -1, 7]


def edit_hooks(n_layers: int) -> list:
    """An in-place edit (zero head 1's z in the last block) and a replacement (halve a residual)."""

    def zero_head(z, hook):
        z[:, :, 1] = 0.0

    return [(f"blocks.{n_layers - 1}.attn.hook_z", zero_head), ("blocks.1.hook_resid_post", lambda r, hook: r * 0.5)]


def checks(model) -> dict:
    """Everything the parity test compares; runs the same on a single-process and a pipelined model."""
    n_layers, vocab = model.cfg.n_layers, model.cfg.d_vocab
    toks = prompt_tokens(vocab)
    out = {"logits": model(toks)}
    out["logits_micro"] = model(toks, micro_batches=2) if isinstance(model, PipelineTransformer) else out["logits"]
    out["loss"] = model(toks, return_type="loss")
    out["stop0"], out["stop2"], out["stop_neg"] = (model(toks, stop_at_layer=s) for s in (0, 2, -1))
    # start_at_layer: the residual entering block 2 (and 0, n_layers) run through the rest, as in one process
    out["start2"] = model(out["stop2"], start_at_layer=2)
    out["start2_loss"] = model(out["stop2"], start_at_layer=2, tokens=toks, return_type="loss")
    out["start0_to_3"] = model(out["stop0"], start_at_layer=0, stop_at_layer=3)
    out["start_last"] = model(model(toks, stop_at_layer=n_layers), start_at_layer=n_layers)
    micro = {"micro_batches": 2} if isinstance(model, PipelineTransformer) else {}
    out["start2_micro"] = model(out["stop2"], start_at_layer=2, **micro)
    _, stopped = model.run_with_cache(toks, stop_at_layer=2)
    out["stopped_cache"] = stopped["blocks.1.hook_resid_post"]
    out["edited"] = model.run_with_hooks(toks, fwd_hooks=edit_hooks(n_layers))
    with model.hooks(fwd_hooks=edit_hooks(n_layers)):
        out["edited_ctx"] = model(toks)
    kwargs = {"micro_batches": 2} if isinstance(model, PipelineTransformer) else {}
    _, micro_cache = model.run_with_cache(toks, **kwargs)  # slices cached per micro-batch, concatenated
    out["resid_mid_micro"] = micro_cache["blocks.1.hook_resid_mid"]
    _, cache = model.run_with_cache(toks)
    out["resid_post_last"] = cache[f"blocks.{n_layers - 1}.hook_resid_post"]
    out["pattern0"] = cache["pattern", 0]
    out["embed"] = cache["hook_embed"]
    out["accumulated"] = cache.accumulated_resid(apply_ln=True)
    decomposed = cache.decompose_resid(apply_ln=True)
    out["decomposed"] = decomposed
    out["logit_attrs"] = cache.logit_attrs(decomposed, tokens=toks[:, -1], incorrect_tokens=toks[:, -2])
    # weight views and cache methods that read every stage's weights (fetched from their ranks)
    out["W_Q"], out["W_O"], out["W_E"], out["W_U"] = model.W_Q, model.W_O, model.W_E, model.W_U
    out["OV"] = model.OV.AB
    out["accumulated_bias"] = model.accumulated_bias(n_layers - 1, mlp_input=True)
    if not model.cfg.num_experts:  # (Gemma-3: through its post-sublayer norms, gains from their ranks)
        out["head_results"] = cache.stack_head_results(layer=-1)
        out["neuron_results"] = cache.get_neuron_results(1)
        out["full_decomposition"] = cache.get_full_resid_decomposition()
    resid_names = ("blocks.0.hook_resid_pre", f"blocks.{n_layers - 1}.hook_resid_post")
    _, grads = model.run_with_cache(toks, return_type="loss", incl_bwd=True, names_filter=lambda n: n in resid_names)
    out["grad_first"], out["grad_last"] = (grads[name + "_grad"] for name in resid_names)
    model.zero_grad(set_to_none=True)
    _, grads = model.run_with_cache(  # gradients of every micro-batch slice travel back, in slice order
        toks, return_type="loss", incl_bwd=True, names_filter=lambda n: n in resid_names, **kwargs
    )
    out["grad_first_micro"], out["grad_last_micro"] = (grads[name + "_grad"] for name in resid_names)
    model.zero_grad(set_to_none=True)
    clean, corrupted = toks[:1], prompt_tokens(vocab, batch=1, seed=1)
    _, clean_cache = model.run_with_cache(clean)
    out["patching"] = get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    prompt = toks[:2, :5]
    out["greedy"] = model.generate(prompt, max_new_tokens=6, do_sample=False, stop_at_eos=False, verbose=False)
    recorded = model.generate(
        prompt,
        max_new_tokens=4,
        do_sample=False,
        stop_at_eos=False,
        verbose=False,
        return_cache=True,
        names_filter=lambda n: n.endswith(("hook_resid_pre", "hook_resid_post", "hook_pattern")),
    )
    out["generate_cache_resid"] = recorded.cache[f"blocks.{n_layers - 1}.hook_resid_post"]
    out["generate_cache_pattern"] = recorded.cache["pattern", 0]
    out["generate_cache_accumulated"] = recorded.cache.accumulated_resid(apply_ln=True)
    out["sampled"] = model.generate(prompt, max_new_tokens=6, do_sample=True, seed=0, stop_at_eos=False, verbose=False)
    out["sampled_no_cache"] = model.generate(
        prompt, max_new_tokens=4, do_sample=True, seed=1, use_past_kv_cache=False, stop_at_eos=False, verbose=False
    )
    return out


def bf16_logits(model) -> torch.Tensor:
    return model(prompt_tokens(model.cfg.d_vocab))


def placement(model) -> dict:
    """Which hooks fired on this rank (per micro-batch) and which cached activations stay here."""
    n_layers, fired = model.cfg.n_layers, []
    toks = prompt_tokens(model.cfg.d_vocab)
    names = [
        "hook_embed",
        "blocks.0.hook_resid_pre",
        f"blocks.{n_layers - 1}.hook_resid_post",
        "ln_final.hook_normalized",
    ]
    model.run_with_hooks(toks, fwd_hooks=[(n, lambda x, hook: fired.append(hook.name)) for n in names], micro_batches=2)
    _, cache_dict = model.run_with_cache(toks, return_cache_object=False)
    return {"fired": fired, "local_names": sorted(cache_dict.local), "all_names": sorted(cache_dict)}


def scenario_parity(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    for directory in model_dirs:
        model = HookedTransformer.from_pretrained(directory, pipeline=True, timeout_s=TIMEOUT_S)
        result = checks(model)
        result.update(placement(model))
        result["logits_bf16"] = bf16_logits(
            HookedTransformer.from_pretrained(directory, pipeline=True, dtype=torch.bfloat16)
        )
        result["requested_keys"] = list(model.requested_keys)
        result["layers"] = list(model.stage.layers)
        torch.save(result, out_dir / f"{Path(directory).name}_rank{rank}.pt")


def _expect_pipeline_error(fn) -> str:
    try:
        fn()
    except PipelineError as e:
        return str(e)
    return "no error"


def scenario_faults(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    """A hook failing on the last rank; bad input on rank 0; then the group still works."""
    model = HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=TIMEOUT_S)
    world = model.stage.world_size
    toks = prompt_tokens(model.cfg.d_vocab)

    def boom(x, hook):
        raise ValueError("hook failed on purpose")

    report = {"world": world}
    last_block = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    report["hook"] = _expect_pipeline_error(lambda: model.run_with_hooks(toks, fwd_hooks=[(last_block, boom)]))
    report["hook_micro"] = _expect_pipeline_error(
        lambda: model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", boom)], micro_batches=2)
    )
    bad = toks.clone()
    if rank == 0:
        bad[0, 0] = model.cfg.d_vocab + 5  # out of range only where the input is read
    report["input"] = _expect_pipeline_error(lambda: model(bad))
    try:
        model(toks[:1], micro_batches=2)
        report["micro"] = "no error"
    except ValueError as e:
        report["micro"] = f"{type(e).__name__}: {e}"
    report["after"] = model(toks)
    report["fingerprint"] = _expect_pipeline_error(
        lambda: HookedTransformer.from_pretrained(model_dirs[min(rank, 1)], pipeline=True, timeout_s=TIMEOUT_S)
    )
    torch.save(report, out_dir / f"faults_rank{rank}.pt")


def scenario_too_many_ranks(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    try:
        HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=TIMEOUT_S)
        message = "no error"
    except ValueError as e:
        message = f"{type(e).__name__}: {e}"
    (out_dir / f"too_many_rank{rank}.json").write_text(json.dumps(message))


def scenario_crash(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    """The last rank dies in the middle of a forward; the others must fail, not wait forever."""
    model = HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=20.0)
    toks = prompt_tokens(model.cfg.d_vocab)

    def die(x, hook):
        os._exit(3)

    (out_dir / f"crash_started_rank{rank}").write_text("")
    model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", die)])


def scenario_mismatch(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    """The ranks call different pipelined operations; each must fail at once, naming both (not wait TIMEOUT_S)."""
    model = HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=TIMEOUT_S)
    toks = prompt_tokens(model.cfg.d_vocab)
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(toks)
    report = {}
    start = time.perf_counter()
    report["cache_vs_forward"] = _expect_pipeline_error(lambda: cache[name] if rank == 0 else model(toks))
    report["cache_vs_forward_s"] = time.perf_counter() - start
    report["after"] = model(toks)  # the group still works: every rank raised before any payload moved
    report["cache_after"] = cache[name]

    def backward_on_rank0_only():
        if rank == 0:
            model(toks, return_type="loss").backward()
        else:
            model(toks, return_type="loss")
            model(toks)

    report["backward_vs_forward"] = _expect_pipeline_error(backward_on_rank0_only)
    model.zero_grad(set_to_none=True)
    report["weight_vs_forward"] = _expect_pipeline_error(lambda: model.W_Q if rank == 1 else model(toks))

    def greedy():
        return model.generate(toks[:2, :5], max_new_tokens=3, do_sample=False, stop_at_eos=False, verbose=False)

    report["generate_vs_forward"] = _expect_pipeline_error(lambda: greedy() if rank == 0 else model(toks))
    report["generate_after"] = greedy()
    four = HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=TIMEOUT_S, micro_batches=4)
    report["two_prompts_on_micro4"] = four(toks[:2])  # 2 slices, not an error
    report["two_prompts"] = model(toks[:2])
    torch.save(report, out_dir / f"mismatch_rank{rank}.pt")


def scenario_uncaught(out_dir: Path, model_dirs: list[str], rank: int) -> None:
    """A hook fails on the last rank and nobody catches the error: only that rank prints a traceback."""
    model = HookedTransformer.from_pretrained(model_dirs[0], pipeline=True, timeout_s=TIMEOUT_S)
    last_block = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def boom(x, hook):
        raise ValueError("hook failed on purpose")

    (out_dir / f"uncaught_started_rank{rank}").write_text("")
    model.run_with_hooks(prompt_tokens(model.cfg.d_vocab), fwd_hooks=[(last_block, boom)])


SCENARIOS = {
    "mismatch": scenario_mismatch,
    "uncaught": scenario_uncaught,
    "parity": scenario_parity,
    "faults": scenario_faults,
    "too_many_ranks": scenario_too_many_ranks,
    "crash": scenario_crash,
}

if __name__ == "__main__":
    out, *scenarios = sys.argv[1:]
    for scenario in scenarios:
        name, dirs = scenario.split("=")
        SCENARIOS[name](Path(out), dirs.split(","), int(os.environ["RANK"]))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
