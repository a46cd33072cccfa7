"""`require_supported` / `require_rope_types`: a converter refuses a config value it does not implement."""

from types import SimpleNamespace

import pytest

from hooked.core.errors import CheckpointError, UnsupportedConfigError
from hooked.loading.config_checks import require_rope_types, require_supported


def test_a_supported_value_passes_and_is_returned():
    hf = SimpleNamespace(scoring_func="softmax")
    assert require_supported(hf, "Demo", "scoring_func", ("softmax", "sigmoid")) == "softmax"
    assert require_supported(hf, "Demo", "absent", (None,)) is None  # the default is checked too


def test_an_unsupported_value_is_refused_naming_family_field_value_and_what_is_implemented():
    hf = SimpleNamespace(scoring_func="sparsemixer", n_group=3)
    with pytest.raises(UnsupportedConfigError, match=r"Demo: config.scoring_func='sparsemixer' .*'softmax', 'sigmoid'"):
        require_supported(hf, "Demo", "scoring_func", ("softmax", "sigmoid"))
    with pytest.raises(UnsupportedConfigError, match=r"config.n_group=3 .*one group"):
        require_supported(hf, "Demo", "n_group", lambda v: v in (None, 1), describe="one group")
    assert issubclass(UnsupportedConfigError, (CheckpointError, NotImplementedError))


def test_rope_types_read_from_transformers_5_and_4():
    require_rope_types(SimpleNamespace(rope_parameters={"rope_type": "default"}), "Demo", {"default"})
    require_rope_types(SimpleNamespace(rope_scaling={"type": "linear", "factor": 2.0}), "Demo", {"default", "linear"})
    with pytest.raises(UnsupportedConfigError, match=r"rope_type'\]='longrope' .*default, yarn"):
        require_rope_types(SimpleNamespace(rope_parameters={"rope_type": "longrope"}), "Demo", {"default", "yarn"})
    per_layer = {"full_attention": {"rope_type": "proportional"}, "sliding_attention": {"rope_type": "default"}}
    require_rope_types(SimpleNamespace(rope_parameters=per_layer), "Demo", {"default"}, layer_type="sliding_attention")
    with pytest.raises(UnsupportedConfigError, match="proportional"):
        require_rope_types(SimpleNamespace(rope_parameters=per_layer), "Demo", {"default"}, layer_type="full_attention")
