"""A byte-level BPE tokenizer for Shakespeare's works, trained on the first 90 % of the characters (the text
dataset's data.args.val_fraction = 0.1 cuts its token stream near there), written as a tokenizer.json for
`data.name = "text"`.

Why: the character-level workload's head (65 outputs) is too narrow for FP8, so FP8's convergence check with the
head in FP8 (precision.fp8_head) needs a subword vocabulary; 4,096 tokens is a multiple of 16 (FP8 matmuls) and
small enough that 1,000 steps see each token many times.

Usage: python benchmarks/shakespeare_bpe.py OUT.json [--vocab 4096]  (after `turbotrain data fetch shakespeare`)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from turbotrain.data.fetch import fetch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="where to write tokenizer.json")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="the held-out tail, not trained on (default 0.1)")
    args = p.parse_args(argv)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = (fetch("shakespeare") / "shakespeare.txt").read_text(encoding="utf-8")
    train = text[: int(len(text) * (1 - args.val_fraction))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(train.splitlines(keepends=True), trainer)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tok.save(args.out)
    n = len(tok.encode(text).ids)
    print(f"{args.out}: vocab {tok.get_vocab_size()}, {n:,} tokens for {len(text):,} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
