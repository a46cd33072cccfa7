import pytest
import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def tokenizer():
    from tests.helpers import make_tokenizer

    return make_tokenizer()


@pytest.fixture(scope="session")
def bos_tokenizer():
    from tests.helpers import make_tokenizer

    return make_tokenizer(prepends_bos=True)
