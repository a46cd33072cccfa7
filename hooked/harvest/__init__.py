"""Harvest hook activations over a corpus to sharded safetensors, and read them back as a stream.

from hooked.harvest import harvest, ActivationReader
harvest(model, "corpus/", "blocks.6.hook_resid_post", "acts/", context_length=128, max_tokens=10**7)
for batch in ActivationReader("acts/").batches(4096, shuffle=True, seed=0): ...
"""

from hooked.harvest.corpus import Corpus
from hooked.harvest.harvest import harvest
from hooked.harvest.reader import ActivationReader
from hooked.harvest.writer import HarvestInterrupted, HarvestMismatchError, HarvestWriteError

__all__ = ["ActivationReader", "Corpus", "HarvestInterrupted", "HarvestMismatchError", "HarvestWriteError", "harvest"]
