"""`transformer_lens.evals`: quick loss evaluations (the data loaders read small HF datasets)."""

from __future__ import annotations

import torch

SANITY_TEXT = (
    "Many important transition points in the history of science have been moments when science 'zoomed in.' "
    "At these points, we develop a visualization or tool that allows us to see the world in a new level of detail, "
    "and a new field of science develops to study the world through this lens."
)

# name -> (load_dataset arguments, text column)
DATASETS = {
    "wiki": (("wikitext", "wikitext-2-v1"), "text"),
    "owt": (("stas/openwebtext-10k",), "text"),
    "pile": (("NeelNanda/pile-10k",), "text"),
    "code": (("codeparrot/codeparrot-valid-v2-near-dedup",), "content"),
}
DATASET_NAMES = list(DATASETS)


def sanity_check(model) -> torch.Tensor:
    """The loss on one paragraph: below ~5 the model is probably fine, above ~7 something is wrong."""
    return model(SANITY_TEXT, return_type="loss")


def _data_loader(name: str, tokenizer, batch_size: int = 8):
    from datasets import load_dataset
    from torch.utils.data import DataLoader

    from hooked.compat.utils import tokenize_and_concatenate

    args, column = DATASETS[name]
    dataset = tokenize_and_concatenate(load_dataset(*args, split="train"), tokenizer, column_name=column)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)


def make_wiki_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("wiki", tokenizer, batch_size)


def make_owt_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("owt", tokenizer, batch_size)


def make_pile_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("pile", tokenizer, batch_size)


def make_code_data_loader(tokenizer, batch_size: int = 8):
    return _data_loader("code", tokenizer, batch_size)


DATASET_LOADERS = [make_wiki_data_loader, make_owt_data_loader, make_pile_data_loader, make_code_data_loader]


@torch.inference_mode()
def evaluate_on_dataset(model, data_loader, truncate: int = 100, device=None) -> float:
    """Mean loss over the batches of a loader of `{"tokens": ...}` (at most `truncate + 1` batches, as TL)."""
    device = device or model.cfg.device
    losses = []
    for batch in data_loader:
        losses.append(model(batch["tokens"].to(device), return_type="loss").mean().item())
        if len(losses) > truncate:
            break
    return sum(losses) / len(losses)


@torch.inference_mode()
def induction_loss(model, tokenizer=None, batch_size: int = 4, subseq_len: int = 384, prepend_bos=None, device=None):
    """Loss on the second half of (BOS +) a random sequence repeated twice: low iff the model does induction."""
    device = device or model.cfg.device
    bos = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    tokens = torch.randint(100, 20000, (batch_size, subseq_len), device=device) % model.cfg.d_vocab
    repeated = torch.cat([tokens, tokens], dim=1)
    if bos:
        bos_id = (tokenizer or model.tokenizer).bos_token_id
        repeated = torch.cat([torch.full((batch_size, 1), bos_id, device=device), repeated], dim=1)
    loss = model(repeated, return_type="loss", loss_per_token=True)
    return loss[:, subseq_len + int(bos) :].mean()


def evaluate(model, truncate: int = 100, batch_size: int = 8, tokenizer=None) -> dict[str, float]:
    """`{"<name>_loss": loss}` on each of the four datasets."""
    tokenizer = tokenizer or model.tokenizer
    return {
        f"{name}_loss": evaluate_on_dataset(model, loader(tokenizer=tokenizer, batch_size=batch_size), truncate)
        for name, loader in zip(DATASET_NAMES, DATASET_LOADERS)
    }


# -- MMLU (zero-shot multiple choice, dataset `cais/mmlu`) ------------------------------

MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality international_law jurisprudence "
    "logical_fallacies machine_learning management marketing medical_genetics miscellaneous moral_disputes "
    "moral_scenarios nutrition philosophy prehistory professional_accounting professional_law professional_medicine "
    "professional_psychology public_relations security_studies sociology us_foreign_policy virology world_religions"
).split()
MMLU_ANSWER_LETTERS = ["A", "B", "C", "D"]


def _mmlu_subjects(subjects) -> list[str]:
    chosen = MMLU_SUBJECTS if subjects is None else [subjects] if isinstance(subjects, str) else list(subjects)
    invalid = sorted(set(chosen) - set(MMLU_SUBJECTS))
    if invalid:
        raise ValueError(f"Invalid subject(s): {invalid}. Valid subjects: {', '.join(MMLU_SUBJECTS)}")
    return chosen


def make_mmlu_data_loader(subjects=None, split: str = "test", num_samples: int | None = None) -> list[dict]:
    """MMLU questions as `{"question", "choices", "answer", "subject"}` (first `num_samples` per subject)."""
    from datasets import load_dataset

    examples = []
    for subject in _mmlu_subjects(subjects):
        dataset = load_dataset("cais/mmlu", subject, split=split)
        n = len(dataset) if num_samples is None else min(num_samples, len(dataset))
        examples += [dict(question=row["question"], choices=row["choices"], answer=row["answer"], subject=subject)
                     for row in (dataset[i] for i in range(n))]
    return examples


def mmlu_prompt(example: dict) -> str:
    options = "".join(f"\n{letter}. {choice}" for letter, choice in zip(MMLU_ANSWER_LETTERS, example["choices"]))
    return f"{example['question']}{options}\nAnswer:"


@torch.inference_mode()
def mmlu_eval(model, tokenizer=None, subjects=None, split: str = "test", num_samples: int | None = None) -> dict:
    """Zero-shot MMLU: the answer is the letter (" A".." D") with the highest next-token logit.

    Returns `accuracy`, `num_correct`, `num_total` and per-subject accuracy `subject_scores`.
    """
    tokenizer = tokenizer or model.tokenizer
    examples = make_mmlu_data_loader(subjects, split, num_samples)
    if not examples:
        raise ValueError("No MMLU data loaded. Check your subjects parameter.")
    letters = [tokenizer.encode(" " + letter, add_special_tokens=False)[-1] for letter in MMLU_ANSWER_LETTERS]
    correct: dict[str, list[bool]] = {}
    for example in examples:
        logits = model(mmlu_prompt(example), return_type="logits")[0, -1, letters]  # [4]
        correct.setdefault(example["subject"], []).append(int(logits.argmax()) == example["answer"])
    num_correct = sum(sum(v) for v in correct.values())
    num_total = sum(len(v) for v in correct.values())
    return dict(accuracy=num_correct / num_total, num_correct=num_correct, num_total=num_total,
                subject_scores={s: sum(v) / len(v) for s, v in correct.items()})
