"""`from hooked import utils` offers TransformerLens's `utils` helpers, as ported code expects."""

import pytest
import torch

from hooked import utils

# the names TransformerLens code (ARENA, the TL demos, SAELens) reaches for through `transformer_lens.utils`
TL_NAMES = [
    "get_device",
    "gelu_new",
    "gelu_fast",
    "solu",
    "tokenize_and_concatenate",
    "get_act_name",
    "test_prompt",
    "to_numpy",
    "lm_cross_entropy_loss",
    "lm_accuracy",
    "remove_batch_dim",
    "Slice",
    "get_corner",
    "transpose",
    "composition_scores",
    "sample_logits",
    "get_attention_mask",
    "keep_single_column",
    "get_dataset",
    "download_file_from_hf",
    "print_gpu_mem",
    "is_square",
    "is_lower_triangular",
    "check_structure",
    "get_nested_attr",
    "set_nested_attr",
    "init_xavier_uniform_",
    "init_kaiming_normal_",
    "USE_DEFAULT_VALUE",
]


@pytest.mark.parametrize("name", TL_NAMES)
def test_tl_helper_is_offered(name):
    import hooked.compat.utils as tl_utils

    if name in vars(utils):  # hooked's own helper of that name (same signature)
        assert name in vars(tl_utils)
    else:
        assert getattr(utils, name) is getattr(tl_utils, name)
    assert name in dir(utils)


def test_helpers_work_and_unknown_names_fail():
    x = torch.linspace(-3, 3, 7)
    expected = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    torch.testing.assert_close(utils.gelu_new(x), expected, atol=1e-6, rtol=1e-6)
    assert isinstance(utils.get_device(), torch.device)
    assert utils.get_act_name("pattern", 3) == "blocks.3.attn.hook_pattern"
    with pytest.raises(AttributeError, match="no attribute 'not_a_helper'"):
        _ = utils.not_a_helper
    with pytest.raises(AttributeError):
        _ = utils._private_thing
