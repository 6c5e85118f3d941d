"""Small generated datasets in the exact Hugging Face schemas of the tasks whose real data is not offline.

Each writer produces what a real user has after `load_dataset(...).save_to_disk(folder)` (ClassLabel and
Image features included), or the JSON Lines a user gets from `Dataset.to_json`, so the tests drive the
same loader code as a real run. Schemas: coastalcph/lex_glue eurlex (and ../shared/data/eurlex's EURLEX57K),
web_of_science WOS46985, google-research-datasets/go_emotions simplified (and ../shared/data/goemotions's JSON
Lines), nyu-mll/glue mnli / qnli / qqp, ylecun/mnist, uoft-cs/cifar10, uoft-cs/cifar100.
The last section writes broken files, as users end up with them (cut-off downloads, misnamed files).
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

WORDS = [
    "court", "regulation", "import", "tariff", "member", "state", "fishery", "quota", "wheat", "animal",
    "health", "directive", "council", "protein", "signal", "neural", "network", "molecule", "voltage",
    "enzyme", "theorem",
]


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def save_to_disk(folder: Path, splits: dict[str, dict[str, list[Any]]], features: Any) -> Path:
    import datasets

    dd = datasets.DatasetDict({name: datasets.Dataset.from_dict(cols, features=features)
                               for name, cols in splits.items()})
    dd.save_to_disk(str(folder))
    return folder


EURLEX_LABELS = [str(100150 + i) for i in range(12)]  # EuroVoc concept ids, as LexGLUE names its ClassLabel


def eurlex_rows(n: int, seed: int) -> dict[str, list[Any]]:
    rng = random.Random(seed)
    labels = [sorted(rng.sample(range(len(EURLEX_LABELS)), rng.randint(1, 3))) for _ in range(n)]
    return {"text": [sentence(rng, 30) for _ in range(n)], "labels": labels}


def eurlex(folder: Path, sizes: tuple[int, int, int] = (60, 20, 20)) -> Path:
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "labels": datasets.Sequence(datasets.ClassLabel(names=EURLEX_LABELS))})
    splits = {name: eurlex_rows(n, i)
              for i, (name, n) in enumerate(zip(("train", "validation", "test"), sizes, strict=True))}
    return save_to_disk(folder, splits, features)


# EURLEX57K's layout (../shared/data/eurlex): EUROVOC descriptor ids as strings, names in labels.json; the
# last two concepts never occur in train, so they are only in `labels_all` (as the real data's 163 zero-shot
# concepts).
EURLEX57K_NAMES = {"3": "adhesive", "4": "State trading", "5": "retail trade", "6": "wholesale trade",
                   "7": "arms trade", "9": "foreign trade", "10": "domestic trade",
                   "11": "international trade", "12": "accession to the European Union", "13": "marketing",
                   "15": "committee of inquiry", "20": "award of contract"}
EURLEX57K_IN_TRAIN = list(EURLEX57K_NAMES)[:10]


def eurlex57k(folder: Path, sizes: tuple[int, int, int] = (60, 20, 20)) -> Path:
    """JSON Lines {"text", "labels", "labels_all", "id"} per split and labels.json, as tools/make_eurlex.py
    writes them. Concept "3" is on every row, "4" on every other, "5" on every third: in train the three most
    frequent. Every fifth validation and test row also has a zero-shot concept, in `labels_all` only."""
    concepts = list(EURLEX57K_NAMES)
    for seed, (split, n) in enumerate(zip(("train", "validation", "test"), sizes, strict=True)):
        rng = random.Random(seed)
        rows = []
        for i in range(n):
            picked = {"3", *(["4"] if i % 2 == 0 else []), *(["5"] if i % 3 == 0 else []),
                      rng.choice(concepts[3:10])}
            every = sorted(picked | ({rng.choice(concepts[10:])} if split != "train" and i % 5 == 0
                                     else set()), key=int)
            rows.append({"text": sentence(rng, 30), "labels": sorted(picked, key=int), "labels_all": every,
                         "id": f"3{seed}{i:04d}R"})
        write_jsonl(folder / f"{split}.jsonl.gz", rows)
    (folder / "labels.json").write_text(json.dumps(EURLEX57K_NAMES, indent=0), encoding="utf-8")
    return folder


def wos_rows(n: int, seed: int, parents: int = 3, children_per_parent: int = 2) -> dict[str, list[Any]]:
    rng = random.Random(seed)
    level1 = [rng.randrange(parents) for _ in range(n)]
    level2 = [rng.randrange(children_per_parent) for _ in range(n)]
    # label = the global child id (0..133 in the real data), label_level_2 = the area within the domain
    label = [p * children_per_parent + c for p, c in zip(level1, level2, strict=True)]
    return {"input_data": [sentence(rng, 20) for _ in range(n)], "label": label,
            "label_level_1": level1, "label_level_2": level2}


def wos46985(folder: Path, n: int = 100, single: bool = False) -> Path:
    """The hub dataset has a single `train` split (the paper carves 6.4 : 1.6 : 2). single=True saves the
    `Dataset` itself (`load_dataset(..., split="train").save_to_disk(folder)`) instead of the DatasetDict."""
    import datasets

    features = datasets.Features({"input_data": datasets.Value("string"), "label": datasets.Value("int32"),
                                  "label_level_1": datasets.Value("int32"),
                                  "label_level_2": datasets.Value("int32")})
    if single:
        datasets.Dataset.from_dict(wos_rows(n, 0), features=features).save_to_disk(str(folder))
        return folder
    return save_to_disk(folder, {"train": wos_rows(n, 0)}, features)


# The hub's ClassLabel order (the authors' emotions.txt, neutral last), as ../shared/data/goemotions/meta.json
# lists it.
GOEMOTIONS_LABELS = [
    "admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion", "curiosity", "desire",
    "disappointment", "disapproval", "disgust", "embarrassment", "excitement", "fear", "gratitude", "grief",
    "joy", "love", "nervousness", "optimism", "pride", "realization", "relief", "remorse", "sadness",
    "surprise", "neutral",
]


def goemotions_rows(n: int, seed: int) -> dict[str, list[Any]]:
    """Columns of the hub's `simplified` config: label ids, 1 to 3 per row; train (seed 0, n >= 28) holds all
    28."""
    rng = random.Random(seed)
    first = [i % len(GOEMOTIONS_LABELS) if seed == 0 else rng.randrange(len(GOEMOTIONS_LABELS))
             for i in range(n)]
    labels = [sorted({f, *rng.sample(range(len(GOEMOTIONS_LABELS)), rng.randint(0, 2))}) for f in first]
    return {"text": [sentence(rng, 12) for _ in range(n)], "labels": labels,
            "id": [f"e{seed}{i:05d}" for i in range(n)]}


GOEMOTIONS_SIZES = (60, 20, 20)


def goemotions(folder: Path, sizes: tuple[int, int, int] = GOEMOTIONS_SIZES) -> Path:
    """The JSON Lines of ../shared/data/goemotions: {"text", "labels": [names], "id"} per row."""
    for seed, (split, n) in enumerate(zip(("train", "validation", "test"), sizes, strict=True)):
        cols = goemotions_rows(n, seed)
        write_jsonl(folder / f"{split}.jsonl.gz", [
            {"text": t, "labels": [GOEMOTIONS_LABELS[i] for i in ids], "id": r}
            for t, ids, r in zip(cols["text"], cols["labels"], cols["id"], strict=True)])
    return folder


def goemotions_hub(folder: Path, sizes: tuple[int, int, int] = GOEMOTIONS_SIZES) -> Path:
    """What `load_dataset("google-research-datasets/go_emotions", "simplified").save_to_disk(folder)`
    writes."""
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "labels": datasets.Sequence(datasets.ClassLabel(names=GOEMOTIONS_LABELS)),
                                  "id": datasets.Value("string")})
    splits = {split: goemotions_rows(n, seed)
              for seed, (split, n) in enumerate(zip(("train", "validation", "test"), sizes, strict=True))}
    return save_to_disk(folder, splits, features)


GLUE_SCHEMA = {  # config: (first text field, second text field, ClassLabel names, split names)
    "mnli": ("premise", "hypothesis", ["entailment", "neutral", "contradiction"],
             ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")),
    "qnli": ("question", "sentence", ["entailment", "not_entailment"], ("train", "validation", "test")),
    "qqp": ("question1", "question2", ["not_duplicate", "duplicate"], ("train", "validation", "test")),
}


def glue(config: str, folder: Path, n: int = 40) -> Path:
    """GLUE as on the hub: the test splits carry label -1 (hidden)."""
    import datasets

    first, second, names, split_names = GLUE_SCHEMA[config]
    features = datasets.Features({first: datasets.Value("string"), second: datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names), "idx": datasets.Value("int32")})
    splits = {}
    for i, split in enumerate(split_names):
        rng = random.Random(i)
        hidden = split.startswith("test")
        labels = [-1 if hidden else rng.randrange(len(names)) for _ in range(n)]
        splits[split] = {first: [sentence(rng) for _ in range(n)], second: [sentence(rng) for _ in range(n)],
                         "label": labels, "idx": list(range(n))}
    return save_to_disk(folder, splits, features)


def glue_jsonl(config: str, folder: Path, n: int = 40) -> Path:
    """GLUE as `Dataset.to_json` writes it (integer labels), train + validation only."""
    first, second, names, _ = GLUE_SCHEMA[config]
    for i, split in enumerate(("train", "validation")):
        rng = random.Random(i)
        write_jsonl(folder / f"{split}.jsonl.gz", [
            {first: sentence(rng), second: sentence(rng), "label": rng.randrange(len(names)), "idx": j}
            for j in range(n)])
    return folder


IMAGE_SCHEMA = {  # task: (image field, label field, image mode, size, class names)
    "mnist": ("image", "label", "L", 28, [str(i) for i in range(10)]),
    "cifar10": ("img", "label", "RGB", 32, ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                             "horse", "ship", "truck"]),
    "cifar100": ("img", "fine_label", "RGB", 32, [f"class_{i}" for i in range(100)]),
}


def images(task: str, folder: Path, sizes: tuple[int, int] = (40, 10)) -> Path:
    """train + test, PNG-encoded `Image` features (cifar100 also has coarse_label), no validation split."""
    import datasets
    from PIL import Image

    image_field, label_field, mode, size, names = IMAGE_SCHEMA[task]
    spec = {image_field: datasets.Image(), label_field: datasets.ClassLabel(names=names)}
    if task == "cifar100":
        spec["coarse_label"] = datasets.ClassLabel(names=[f"super_{i}" for i in range(20)])
    splits = {}
    for i, (split, n) in enumerate(zip(("train", "test"), sizes, strict=True)):
        rng = np.random.default_rng(i)
        shape = (size, size) if mode == "L" else (size, size, 3)
        # Every class appears in train, so the test labels are always known.
        labels = [j % len(names) for j in range(n)] if split == "train" else \
            list(rng.integers(0, min(n, 10), n))
        cols: dict[str, list[Any]] = {
            image_field: [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
                          for _ in range(n)],
            label_field: [int(v) for v in labels],
        }
        if task == "cifar100":
            cols["coarse_label"] = [int(v) % 20 for v in labels]
        splits[split] = cols
    return save_to_disk(folder, splits, datasets.Features(spec))


# -- broken files ---------------------------------------------------------------------------------------
def labelled(labels: list[Any], seed: int = 0) -> list[dict[str, Any]]:
    """{"text", "label"} rows, one per label."""
    rng = random.Random(seed)
    return [{"text": sentence(rng), "label": label} for label in labels]


def jsonl_text(rows: list[Any]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_plain(path: Path, text: str | bytes) -> Path:
    """A file as given (uncompressed whatever its name says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def truncated_gzip(path: Path, rows: list[Any], keep: float = 0.5) -> Path:
    """A gzip download cut off part-way: the first `keep` of the compressed bytes."""
    blob = gzip.compress(jsonl_text(rows).encode())
    return write_plain(path, blob[: int(len(blob) * keep)])
