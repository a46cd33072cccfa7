"""HookedTransformerConfig: a misspelt field names its close match."""

import pytest

from hooked import HookedTransformerConfig
from hooked.core.errors import ConfigError

BASE = dict(d_model=16, d_head=4, n_layers=1, n_ctx=8, d_vocab=20, act_fn="relu")


def test_misspelt_field_names_the_close_match_and_stays_a_type_error():
    with pytest.raises(TypeError, match=r"'normalisation_type' \(did you mean 'normalization_type'\?\)") as info:
        HookedTransformerConfig(**BASE, normalisation_type=None)
    assert isinstance(info.value, ConfigError)
    with pytest.raises(ConfigError, match=r"'d_mlpp' \(did you mean 'd_mlp'\?\)"):
        HookedTransformerConfig.from_dict(dict(BASE, d_mlpp=32))


def test_unrelated_unknown_field_is_named_without_a_guess():
    with pytest.raises(TypeError, match=r"Unknown HookedTransformerConfig field\(s\): 'zzz'\. "):
        HookedTransformerConfig(**BASE, zzz=1)
    assert HookedTransformerConfig(**BASE, normalization_type=None).normalization_type is None
