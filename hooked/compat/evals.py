"""`transformer_lens.evals`: quick loss evaluations (the data loaders read small HF datasets)."""

from __future__ import annotations

import random

import torch
import torch.utils.data

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
        for name, loader in zip(DATASET_NAMES, DATASET_LOADERS, strict=True)
    }


# -- MMLU (zero-shot multiple choice, dataset `cais/mmlu`) ------------------------------

# fmt: off
MMLU_SUBJECTS = [
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios",
    "nutrition", "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
]
# fmt: on
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
        examples += [
            dict(question=row["question"], choices=row["choices"], answer=row["answer"], subject=subject)
            for row in (dataset[i] for i in range(n))
        ]
    return examples


def mmlu_prompt(example: dict) -> str:
    options = "".join(
        f"\n{letter}. {choice}" for letter, choice in zip(MMLU_ANSWER_LETTERS, example["choices"], strict=True)
    )
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
    return dict(
        accuracy=num_correct / num_total,
        num_correct=num_correct,
        num_total=num_total,
        subject_scores={s: sum(v) / len(v) for s, v in correct.items()},
    )


# -- Indirect object identification (IOI) ------------------------------------------------


class IOIDataset(torch.utils.data.Dataset):
    """IOI prompts: "[A] and [B] ... [B] gave the [OBJECT] to" -> the indirect object " [A]", not " [B]".

    Items are `{"prompt": token ids of the whole sentence, "IO": ids of " A", "S": ids of " B"}`;
    `symmetric=True` adds each prompt with the two names swapped. Sampling is seeded (42).
    """

    def __init__(
        self,
        tokenizer,
        templates=None,
        names=None,
        nouns=None,
        num_samples: int = 1000,
        symmetric: bool = False,
        prepend_bos: bool = True,
    ):
        self.tokenizer, self.prepend_bos = tokenizer, prepend_bos
        self.templates = templates or self.get_default_templates()
        self.names = names or self.get_default_names()
        self.nouns = nouns or self.get_default_nouns()
        rng = random.Random(42)
        self.samples = [s for _ in range(num_samples // (2 if symmetric else 1)) for s in self._sample(rng, symmetric)]

    def _sample(self, rng: random.Random, symmetric: bool) -> list[dict[str, str]]:
        template = rng.choice(self.templates)
        for kind, words in self.nouns.items():
            template = template.replace(f"[{kind}]", rng.choice(words))
        a, b = rng.sample(self.names, 2)
        pairs = [(a, b), (b, a)] if symmetric else [(a, b)]
        return [
            {"text": template.replace("[A]", io).replace("[B]", s), "IO": " " + io, "S": " " + s} for io, s in pairs
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        sample = self.samples[idx]
        prompt = self.tokenizer.encode(sample["text"])
        if self.prepend_bos:
            prompt = [self.tokenizer.bos_token_id] + prompt
        return {
            "prompt": torch.LongTensor(prompt),
            "IO": torch.LongTensor(self.tokenizer.encode(sample["IO"])),
            "S": torch.LongTensor(self.tokenizer.encode(sample["S"])),
        }

    @staticmethod
    def get_default_names() -> list[str]:
        return ["John", "Mary"]

    @staticmethod
    def get_default_templates() -> list[str]:
        return [
            "[A] and [B] went to the [LOCATION] to buy [OBJECT]. [B] handed the [OBJECT] to [A]",
            "Then, [B] and [A] went to the [LOCATION]. [B] gave the [OBJECT] to [A]",
        ]

    @staticmethod
    def get_default_nouns() -> dict[str, list[str]]:
        return {"LOCATION": ["store", "market"], "OBJECT": ["milk", "eggs", "bread"]}


@torch.inference_mode()
def ioi_eval(
    model, dataset=None, batch_size: int = 8, num_samples: int = 1000, tokenizer=None, symmetric: bool = False
) -> dict[str, float]:
    """Mean logit difference IO - S at the first token where the two names differ, and how often it is > 0."""
    dataset = dataset or IOIDataset(tokenizer or model.tokenizer, num_samples=num_samples, symmetric=symmetric)
    total_diff, total_correct = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        prompts = torch.nn.utils.rnn.pad_sequence([item["prompt"] for item in items], batch_first=True)
        logits = model(prompts, return_type="logits")  # [batch, pos, vocab]; right padding leaves rows intact
        for row, item in enumerate(items):
            n = min(len(item["IO"]), len(item["S"]))
            io, s = item["IO"][:n], item["S"][:n]
            first = int(torch.nonzero(io != s)[0])  # the first token where the names differ
            position = len(item["prompt"]) - len(item["IO"]) + first - 1  # the token predicting it
            diff = (logits[row, position, io[first]] - logits[row, position, s[first]]).item()
            total_diff, total_correct = total_diff + diff, total_correct + (diff > 0)
    return {"Logit Difference": total_diff / len(dataset), "Accuracy": total_correct / len(dataset)}
