"""SAELatent is SAELens's StandardSAE / JumpReLU encoder for one latent, and reader.stream feeds SAETrainer."""

from __future__ import annotations

import torch

from hooked.compat import alias_transformer_lens
from hooked.viz import SAELatent

alias_transformer_lens()
import sae_lens  # noqa: E402  (installed with --no-deps; needs the alias first)

from tests.unit.harvest._harvest_common import HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: E402,F401


def _randomized(sae):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return sae


def test_sae_latent_equals_sae_lens_standard_encode():
    sae = _randomized(sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=16, d_sae=32)))
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(1))
    want = sae.encode(x).detach()
    assert 0 < int((want > 0).sum()) < want.numel()
    for i in (0, 7, 31):
        got = SAELatent(sae.W_enc.detach(), sae.b_enc.detach(), i, b_dec=sae.b_dec.detach())(x)
        torch.testing.assert_close(got, want[:, i])


def test_sae_latent_with_threshold_equals_sae_lens_jumprelu_encode():
    sae = _randomized(sae_lens.JumpReLUSAE(sae_lens.JumpReLUSAEConfig(d_in=16, d_sae=32)))
    with torch.no_grad():
        sae.threshold.copy_(torch.full((32,), 0.2))
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(1))
    want = sae.encode(x).detach()
    got = SAELatent(sae.W_enc.detach(), sae.b_enc.detach(), 5, b_dec=sae.b_dec.detach(), threshold=0.2)(x)
    torch.testing.assert_close(got, want[:, 5])
    assert ((want[:, 5] == 0) | (want[:, 5] > 0.2)).all() and int((want[:, 5] == 0).sum()) > 0


def test_sae_trainer_trains_on_reader_stream(model, corpus_dir, tmp_path):
    from sae_lens.config import SAETrainerConfig

    from hooked.harvest import ActivationReader, harvest

    harvest(model, corpus_dir, HOOKS[0], tmp_path, context_length=8, max_tokens=256, progress=False)
    reader = ActivationReader(tmp_path)
    d = reader.row_shape(HOOKS[0])[0]
    sae = sae_lens.StandardTrainingSAE(sae_lens.StandardTrainingSAEConfig(d_in=d, d_sae=2 * d, l1_coefficient=1.0))
    before = sae.W_enc.detach().clone()
    served = []

    def provider():
        for batch in reader.stream(HOOKS[0], batch_size=100):
            served.append(batch)
            yield batch

    cfg = SAETrainerConfig(total_training_samples=500, train_batch_size_samples=100, lr=1e-3, lr_end=1e-3, device="cpu")
    trainer = sae_lens.SAETrainer(cfg, sae, data_provider=provider())
    trained = trainer.fit()
    assert trainer.n_training_samples == 500 and len(served) == 5  # 256 rows: the stream went on to a 2nd epoch
    assert all(b.shape == (100, d) and b.dtype == torch.float32 for b in served)
    assert not torch.equal(trained.W_enc.detach(), before)
