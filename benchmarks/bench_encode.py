"""Frozen-feature encoding speed on real EU law (issue 33): documents per second of `encode_split` (the path a
frozen search takes), fp32 against bf16 autocast, with the features' difference.

    HF_HUB_OFFLINE=1 python benchmarks/bench_encode.py                  # 256 eurlex validation documents
    HF_HUB_OFFLINE=1 python benchmarks/bench_encode.py --docs 512 --max-length 128 512 --threads 2

The documents are the first --docs of ../shared/data/eurlex/validation.jsonl.gz, tokenized by MiniLM's tokenizer
(`text_split`, truncated to --max-length), encoded by all-MiniLM-L6-v2 (the offline `minilm` backbone) in batches
of similar length (`encode_split`). Each precision runs --repeats times, alternating; the minimum is printed.
The difference is measured on the stored features (fp16): the largest absolute difference, and the smallest cosine
similarity between a document's fp32 and bf16 vectors.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "eurlex"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=256)
    parser.add_argument("--max-length", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not (DATA / "validation.jsonl.gz").exists():
        sys.exit(f"bench_encode: expected the eurlex data in {DATA}, found none")
    from tune_as.tasks.backbones import load_backbone, load_tokenizer
    from tune_as.tasks.featurize import encode_split, text_split

    torch.set_num_threads(args.threads)
    texts = []
    with gzip.open(DATA / "validation.jsonl.gz", "rt") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) == args.docs:
                break
    tokenizer, info = load_tokenizer("minilm", texts, char_level=False)
    encoder = load_backbone(info, 0)
    flags = " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in Path("/proc/cpuinfo").read_text())
    print(f"# bench_encode: {args.docs} eurlex documents, {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.2f}, torch {torch.__version__}, CPU flags: {flags or 'no bf16'}")
    print(f"{'max_length':>10} {'fp32 docs/s':>12} {'bf16 docs/s':>12} {'speed-up':>9} {'max |diff|':>11} "
          f"{'min cosine':>11}")
    for length in args.max_length:
        split, _ = text_split(tokenizer, texts, None, torch.zeros(len(texts)), length, "eurlex: tokenizing")
        best = {False: float("inf"), True: float("inf")}
        features = {}
        for _ in range(args.repeats):
            for bf16 in (False, True):
                tic = time.perf_counter()
                out = encode_split(encoder, split, False, "eurlex: encoding", bf16=bf16)
                best[bf16] = min(best[bf16], time.perf_counter() - tic)
                features[bf16] = out.columns["features"].float()
        diff = (features[True] - features[False]).abs().max().item()
        cosine = torch.nn.functional.cosine_similarity(features[True], features[False], dim=1).min().item()
        fp32, bf16 = args.docs / best[False], args.docs / best[True]
        print(f"{length:>10} {fp32:>12.1f} {bf16:>12.1f} {bf16 / fp32:>8.2f}x {diff:>11.4f} {cosine:>11.5f}",
              flush=True)


if __name__ == "__main__":
    main()
