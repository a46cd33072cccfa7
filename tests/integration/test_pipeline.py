"""The torch.distributed pipeline (hooked/scale/pipeline.py) against the single-process model.

Real gloo process groups on 127.0.0.1: a world of 2 and one of 3 ranks, spawned from here,
run tiny random checkpoints of four families (GPT-2, Llama with GQA, Gemma 3 with
local/global layers, Mixtral MoE) through `tests/integration/pipeline_worker.py`, which
saves what every rank saw; this process compares it with `from_pretrained` in one process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration import pipeline_worker

pytestmark = pytest.mark.slow

WORKER = Path(pipeline_worker.__file__)
ROOT = WORKER.parents[2]
ATOL = 1e-6  # docs/numerics.md#tolerances: pipelined logits within 1e-6 of the single-process model
WAIT_S = 240
GEMMA3_LAYERS = ["sliding_attention", "full_attention"] * 2


def _save_models(root: Path) -> dict[str, Path]:
    from tests.tiny_models import tiny_gemma, tiny_gpt2, tiny_hf

    makers = {
        "gpt2": lambda: tiny_gpt2(n_layer=4, vocab_size=96, bos_token_id=1, eos_token_id=2),
        "llama_gqa": lambda: tiny_hf("Llama", num_hidden_layers=4, num_key_value_heads=2, tie_word_embeddings=False),
        "gemma3": lambda: tiny_gemma("gemma3_mixed_rope", num_hidden_layers=4, layer_types=GEMMA3_LAYERS),
        "mixtral": lambda: tiny_hf(
            "Mixtral", num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2
        ),
        "two_layers": lambda: tiny_hf("Llama", num_hidden_layers=2),
    }
    dirs = {}
    for name, make in makers.items():
        dirs[name] = root / name
        make().save_pretrained(dirs[name])
    return dirs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, out: Path, scenarios: dict[str, list[Path]], wait_s: float = WAIT_S) -> list[int]:
    """Start `world` ranks of the worker on 127.0.0.1 and wait (bounded) for all; returns exit codes."""
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    args = [f"{name}={','.join(map(str, dirs))}" for name, dirs in scenarios.items()]
    for rank in range(world):
        env = dict(
            os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
        )  # fmt: skip
        cmd = [sys.executable, str(WORKER), str(out), *args]
        with open(out / f"rank{rank}.log", "w") as log:  # the worker writes to its own copy of the descriptor
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=wait_s))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes


def _logs(out: Path) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("rank*.log")))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return _save_models(tmp_path_factory.mktemp("pipeline_models"))


@pytest.fixture(scope="module")
def world2(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world2")
    dirs = [models[n] for n in ("gpt2", "llama_gqa", "gemma3", "mixtral")]
    codes = launch(2, out, {"parity": dirs, "faults": [models["gpt2"], models["llama_gqa"]]})
    assert codes == [0, 0], _logs(out)
    return out


@pytest.fixture(scope="module")
def world3(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world3")
    scenarios = {"parity": [models["llama_gqa"]], "too_many_ranks": [models["two_layers"]], "crash": [models["gpt2"]]}
    codes = launch(3, out, scenarios)
    assert (out / "crash_started_rank2").exists(), _logs(out)
    out.joinpath("codes.json").write_text(json.dumps(codes))
    return out


def _load(directory: Path, **kwargs):
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained(str(directory), **kwargs)


def _single_threaded(fn):
    """`fn()` with one torch thread, as each rank runs (OMP_NUM_THREADS=1): the same reduction order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def reference(directory: Path) -> dict:
    return _single_threaded(lambda: pipeline_worker.checks(_load(directory)))


def _compare(got: dict, want: dict, name: str, rank: int) -> None:
    for key in ("logits", "logits_micro", "loss", "edited", "edited_ctx", "resid_post_last", "pattern0", "embed",
                "accumulated", "decomposed", "logit_attrs", "patching", "resid_mid_micro", "grad_first", "grad_last",
                "grad_first_micro",
                "grad_last_micro", "generate_cache_resid", "generate_cache_pattern", "generate_cache_accumulated",
                "W_Q", "W_O", "W_E", "W_U", "OV", "accumulated_bias", "head_results", "neuron_results",
                "full_decomposition",
                "stop0", "stop2", "start2", "start2_loss", "start0_to_3", "start_last", "start2_micro",
                "stop_neg", "stopped_cache"):  # fmt: skip
        if key not in want:  # (head and neuron results: families without experts)
            continue
        torch.testing.assert_close(
            got[key], want[key], atol=ATOL, rtol=0, msg=lambda m, key=key: f"{name} rank {rank} {key}: {m}"
        )
    for key in ("greedy", "sampled", "sampled_no_cache"):
        assert torch.equal(got[key], want[key]), f"{name} rank {rank}: {key} tokens differ"


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma3", "mixtral"])
def test_two_ranks_match_one_process(world2, models, name):
    want = reference(models[name])
    for rank in range(2):
        got = torch.load(world2 / f"{name}_rank{rank}.pt", weights_only=False)
        assert got["layers"] == [[0, 1], [2, 3]][rank]
        _compare(got, want, name, rank)
    assert not torch.equal(want["edited"], want["logits"]), "the editing hooks must change the logits"
    want_bf16 = _single_threaded(lambda: pipeline_worker.bf16_logits(_load(models[name], dtype=torch.bfloat16)))
    for rank in range(2):
        got = torch.load(world2 / f"{name}_rank{rank}.pt", weights_only=False)["logits_bf16"]
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want_bf16, atol=0, rtol=0)  # the same bfloat16 ops, split over ranks


def test_hooks_run_and_activations_stay_on_the_owning_rank(world2, world3):
    for out, world in ((world2, 2), (world3, 3)):
        ranks = [torch.load(out / f"llama_gqa_rank{r}.pt", weights_only=False) for r in range(world)]
        last = "blocks.3.hook_resid_post"
        fired = [["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_pre"]]
        fired += [[]] * (world - 2) + [[last, "ln_final.hook_normalized", last, "ln_final.hook_normalized"]]
        assert [r["fired"] for r in ranks] == fired  # the embedding once, block hooks once per micro-batch
        names = ranks[0]["all_names"]
        assert all(r["all_names"] == names for r in ranks)
        assert sorted(n for r in ranks for n in r["local_names"]) == names  # each activation on one rank only
        for r in ranks:
            layers = {int(n.split(".")[1]) for n in r["local_names"] if n.startswith("blocks.")}
            assert layers == set(r["layers"])


@pytest.mark.parametrize("name", ["llama_gqa"])
def test_three_ranks_match_one_process(world3, models, name):
    want = reference(models[name])
    for rank in range(3):
        got = torch.load(world3 / f"{name}_rank{rank}.pt", weights_only=False)
        assert got["layers"] == [[0, 1], [2], [3]][rank]
        _compare(got, want, name, rank)


def _layer(key: str) -> int | None:
    parts = key.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] in ("layers", "h") and parts[2].isdigit() else None


@pytest.mark.parametrize("world_name", ["world2", "world3"])
def test_each_rank_reads_only_its_tensors(request, models, world_name):
    from hooked.loading.checkpoint import SafetensorsStateDict, safetensors_files

    out = request.getfixturevalue(world_name)
    world = 2 if world_name == "world2" else 3
    state = SafetensorsStateDict(safetensors_files(models["llama_gqa"]))
    for rank in range(world):
        got = torch.load(out / f"llama_gqa_rank{rank}.pt", weights_only=False)
        requested = got["requested_keys"]
        assert len(requested) == len(set(requested)), "a tensor was read twice"
        layer_keys = {k for k in requested if _layer(k) is not None}
        assert layer_keys == {k for k in state if _layer(k) in got["layers"]}
        others = set(requested) - layer_keys
        want = {"model.embed_tokens.weight"} if rank == 0 else set()
        if rank == world - 1:
            want |= {"model.norm.weight", "lm_head.weight"}  # untied: the last rank never reads the embedding
        assert others == want


def test_faults_reach_every_rank_without_hanging(world2):
    reports = [torch.load(world2 / f"faults_rank{r}.pt", weights_only=False) for r in range(2)]
    for rank, report in enumerate(reports):
        assert "rank 1 failed: ValueError: hook failed on purpose" in report["hook"], (rank, report["hook"])
        assert "rank 0 failed: ValueError: hook failed on purpose" in report["hook_micro"], report["hook_micro"]
        assert "rank 0 failed: TokenError" in report["input"], report["input"]
        assert report["micro"].startswith("InputError") and "micro_batches=2" in report["micro"]
        assert "different checkpoints" in report["fingerprint"] and "[[0], [1]]" in report["fingerprint"]
    torch.testing.assert_close(reports[0]["after"], reports[1]["after"], atol=0, rtol=0)
    # the rank that failed has the traceback; the other one points at it
    assert "traceback is in" not in reports[1]["hook"] and "(the traceback is in rank 1's output)" in reports[0]["hook"]
    assert (
        "traceback is in" not in reports[0]["input"] and "(the traceback is in rank 0's output)" in reports[1]["input"]
    )


@pytest.fixture(scope="module")
def world2_mismatch(models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world2_mismatch")
    codes = launch(2, out, {"mismatch": [models["gpt2"]], "uncaught": [models["gpt2"]]})
    assert all((out / f"uncaught_started_rank{r}").exists() for r in range(2)), _logs(out)
    assert codes[0] != 0 and codes[1] != 0, _logs(out)
    return out


def test_ranks_in_different_operations_fail_at_once_naming_both(world2_mismatch):
    """Rank 0 reads the cache while rank 1 runs the next forward: both fail in seconds, not the timeout."""
    reports = [torch.load(world2_mismatch / f"mismatch_rank{r}.pt", weights_only=False) for r in range(2)]
    for report in reports:
        message = report["cache_vs_forward"]
        assert message.startswith("rank 0 is reading cache['blocks.3.hook_resid_post'] (pipelined call #"), message
        assert "while rank 1 is in forward() (pipelined call #" in message, message
        assert "cache reads are collectives: call them on every rank in the same order" in message
        assert report["cache_vs_forward_s"] < 5.0 < pipeline_worker.TIMEOUT_S, report["cache_vs_forward_s"]
        assert "rank 0 is in backward()" in report["backward_vs_forward"], report["backward_vs_forward"]
        assert "rank 1 is in forward()" in report["backward_vs_forward"]
        assert "rank 0 is in forward()" in report["weight_vs_forward"], report["weight_vs_forward"]
        assert "rank 1 is reading weight blocks.0.attn.W_Q" in report["weight_vs_forward"]
        assert "same pipelined calls" in report["weight_vs_forward"]
        generate = report["generate_vs_forward"]
        assert (
            generate.startswith("rank 0 is in generate() step 0 (pipelined call #")
            and "rank 1 is in forward()" in generate
        )
    for key in ("after", "cache_after", "two_prompts_on_micro4", "generate_after"):
        torch.testing.assert_close(reports[0][key], reports[1][key], atol=0, rtol=0)
    torch.testing.assert_close(reports[0]["two_prompts_on_micro4"], reports[0]["two_prompts"], atol=ATOL, rtol=0)


def test_an_uncaught_failure_prints_one_traceback(world2_mismatch):
    """The hook fails on rank 1: its log has the traceback, rank 0's a single line pointing at rank 1."""
    logs = [(world2_mismatch / f"rank{r}.log").read_text() for r in range(2)]
    assert "Traceback" in logs[1] and "ValueError: hook failed on purpose" in logs[1], logs[1]
    assert "Traceback" not in logs[0], logs[0]
    lines = [line for line in logs[0].splitlines() if "PipelineError" in line]
    assert len(lines) == 1 and "rank 1 failed: ValueError: hook failed on purpose" in lines[0], logs[0]
    assert "(the traceback is in rank 1's output)" in lines[0]


def test_more_ranks_than_blocks_is_refused(world3):
    for rank in range(3):
        message = json.loads((world3 / f"too_many_rank{rank}.json").read_text())
        assert message.startswith("InputError") and "3 ranks" in message and "only 2 blocks" in message


def test_a_dead_rank_ends_the_others(world3):
    """The last of 3 ranks dies inside a forward (after the scenarios above): the others fail, not hang."""
    codes = json.loads((world3 / "codes.json").read_text())
    assert codes[2] == 3  # the rank that died
    assert codes[0] != 0 and codes[1] != 0  # connection closed or timeout: an error, not a wait forever
    for rank in (0, 1):
        assert "PipelineError" in (world3 / f"rank{rank}.log").read_text()
