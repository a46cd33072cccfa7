"""Subprocess entry of the harvest tests: `python _harvest_worker.py MODEL_DIR CORPUS OUT '{"kwarg": ...}'`."""

import json
import sys

import torch

from hooked import HookedTransformer
from hooked.harvest import harvest

if __name__ == "__main__":
    torch.set_num_threads(1)
    model_dir, corpus, out, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    model = HookedTransformer.from_pretrained(model_dir, device="cpu")
    harvest(model, corpus, out=out, progress=False, **kwargs)
