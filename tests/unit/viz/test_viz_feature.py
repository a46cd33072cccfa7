"""feature_dashboard: the embedded top contexts and histogram equal what is recomputed from the reader's rows."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError, InputTypeError
from hooked.harvest import ActivationReader, harvest
from hooked.viz import DashboardOptions, SAELatent, embedded_data, feature_dashboard
from tests.unit.harvest._harvest_common import HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: F401

HOOK = HOOKS[0]


@pytest.fixture(scope="module")
def reader(model, corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("acts")
    harvest(
        model,
        corpus_dir,
        HOOKS,
        out,
        context_length=16,
        batch_size=4,
        max_tokens=16 * 40,
        batches_per_shard=2,
        progress=False,
    )
    return ActivationReader(out)


@pytest.fixture(scope="module")
def sae(model, reader):
    """A random SAE encoder centred like a trained one (b_dec = the rows' mean), so its latents fire on some rows."""
    g = torch.Generator().manual_seed(0)
    d, n = model.cfg.d_model, 24
    b_dec = reader.read_all(HOOK).float().mean(0)
    return torch.randn(d, n, generator=g) / d**0.5, torch.randn(n, generator=g) * 0.01 - 0.02, b_dec


def _expected_top(acts: torch.Tensor, contexts: torch.Tensor, k: int) -> list[int]:
    """Rows in decreasing activation, skipping contexts already shown (a plain loop over every row)."""
    rows, seen = [], set()
    for r in sorted(range(len(acts)), key=lambda r: -float(acts[r])):
        if int(contexts[r]) not in seen:
            seen.add(int(contexts[r]))
            rows.append(r)
    return rows[:k]


def _check_examples(view_data, reader, acts, model, left, right):
    contexts, positions = reader.read_all("context_index"), reader.read_all("pos_index")
    tokens, x = reader.read_all("tokens"), reader.read_all(HOOK)
    want = _expected_top(acts, contexts, len(view_data["examples"]))
    assert [e["row"] for e in view_data["examples"]] == want
    for e in view_data["examples"]:
        r = e["row"]
        same = (contexts == contexts[r]) & (positions >= positions[r] - left) & (positions <= positions[r] + right)
        window = same.nonzero()[:, 0]
        assert e["positions"] == positions[window].tolist() and e["pos"] == int(positions[r])
        assert e["token_ids"] == tokens[window].tolist()
        assert e["tokens"] == model.to_str_tokens(tokens[window])
        assert e["positions"][e["max_at"]] == e["pos"]
        assert e["value"] == pytest.approx(float(acts[r]), rel=1e-5, abs=1e-6)
        torch.testing.assert_close(torch.tensor(e["values"]), acts[window])
        assert e["values"][e["max_at"]] == max(e["values"]) or e["values"][e["max_at"]] == pytest.approx(e["value"])
    return x


def test_sae_latent_top_contexts_and_histogram_match_the_reader(reader, model, sae):
    W_enc, b_enc, b_dec = sae
    opts = DashboardOptions(top_k=6, left=5, right=2, bins=10, batch_size=50)
    view = feature_dashboard(reader, HOOK, SAELatent(W_enc, b_enc, 3, b_dec=b_dec), model, options=opts)
    data = embedded_data(view.html)[0]
    x = reader.read_all(HOOK).float()
    acts = torch.relu((x - b_dec) @ W_enc[:, 3] + b_enc[3])  # [rows]: every row at once, from the reader
    assert 100 < int((acts > 0).sum()) < len(acts)  # a latent that fires on some rows only
    _check_examples(data, reader, acts, model, 5, 2)
    assert len(data["examples"]) == 6 and data["n_rows"] == len(reader) == 640
    assert data["max"] == pytest.approx(float(acts.max()), rel=1e-5)
    assert data["density"] == pytest.approx(float((acts > 0).float().mean()))
    h = data["histogram"]
    nonzero = acts[acts > 0]
    assert sum(h["counts"]) == nonzero.numel() and h["zeros"] == int((acts == 0).sum())
    assert h["edges"][0] == pytest.approx(float(nonzero.min()), rel=1e-5)
    assert h["edges"][-1] == pytest.approx(float(nonzero.max()), rel=1e-5)
    inner = torch.tensor(h["edges"][1:-1])
    far = (nonzero[:, None].double() - inner[None]).abs().min(1).values > 1e-5  # values not on a bin edge
    expected = torch.bucketize(nonzero[far].double(), inner, right=True).bincount(minlength=10)
    got = torch.tensor(h["counts"])
    assert (got - expected).abs().sum() <= (~far).sum()  # equal up to values sitting on an edge
    assert data["feature"] == "SAE latent 3" and "blocks.0.hook_resid_post" in data["title"]


def test_direction_tuple_and_callable_give_the_same_dashboard(reader, model, sae):
    W_enc, b_enc, _ = sae
    opts = DashboardOptions(top_k=4, left=3, right=3)
    direction = W_enc[:, 5].clone()
    by_direction = feature_dashboard(reader, HOOK, direction, model, options=opts).data
    by_callable = feature_dashboard(reader, HOOK, lambda x: x @ direction, model, options=opts).data
    acts = reader.read_all(HOOK).float() @ direction
    _check_examples(by_direction, reader, acts, model, 3, 3)
    assert [e["row"] for e in by_callable["examples"]] == [e["row"] for e in by_direction["examples"]]
    assert by_direction["min"] < 0 < by_direction["max"]  # a direction is signed
    by_tuple = feature_dashboard(reader, HOOK, (W_enc, b_enc, 5), model.tokenizer, options=opts).data
    acts = torch.relu(reader.read_all(HOOK).float() @ W_enc + b_enc)[:, 5]
    assert [e["row"] for e in by_tuple["examples"]] == _expected_top(acts, reader.read_all("context_index"), 4)
    assert by_tuple["examples"][0]["tokens"] == [
        model.tokenizer.decode([i]) for i in by_tuple["examples"][0]["token_ids"]
    ]


def test_a_dashboard_on_a_per_head_hook_and_without_a_tokenizer(reader):
    view = feature_dashboard(reader, HOOKS[1], lambda z: z[:, 1].norm(dim=-1), options=DashboardOptions(top_k=3))
    ex = view.data["examples"][0]
    assert ex["tokens"] == [f"#{i}" for i in ex["token_ids"]]
    norms = reader.read_all(HOOKS[1]).float()[:, 1].norm(dim=-1)
    assert ex["value"] == pytest.approx(float(norms.max()), rel=1e-5)


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_bad_arguments_name_the_problem(reader, sae):
    W_enc, b_enc, _ = sae
    with pytest.raises(InputError, match="Unknown hook"):
        feature_dashboard(reader, "blocks.1.hook_resid_post", W_enc[:, 0])
    with pytest.raises(InputError, match="must be \\[d\\]"):
        feature_dashboard(reader, HOOK, W_enc[:-1, 0])
    with pytest.raises(InputError, match="index 99 within d_sae"):
        feature_dashboard(reader, HOOK, SAELatent(W_enc, b_enc, 99))
    with pytest.raises(InputError, match="one activation per row"):
        feature_dashboard(reader, HOOK, lambda x: x[:1, 0])
    with pytest.raises(InputTypeError, match="feature must be"):
        feature_dashboard(reader, HOOK, "latent 3")
    with pytest.raises(InputError, match="top_k=0"):
        feature_dashboard(reader, HOOK, W_enc[:, 0], options=DashboardOptions(top_k=0))
