"""Encoder–decoder generation: the decoder key/value cache (`models.generation.seq2seq.KVCache`) against
re-running the decoder on the whole prefix at every step, greedy decoding of `--new` tokens.

The two contenders alternate run by run in one process (the machine is shared: a ratio of alternated runs is the
trustworthy number). Prints a table, or JSON with `--json`.

    python benchmarks/encdec_generate.py
    python benchmarks/encdec_generate.py --new 255 --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from models import EncoderDecoderConfig, HookedEncoderDecoder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", type=int, default=127, help="tokens to generate")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = EncoderDecoderConfig(d_model=256, n_heads=4, d_mlp=1024, n_encoder_layers=2, n_decoder_layers=2,
                               d_vocab_src=64, d_vocab_tgt=64, n_ctx_src=64, n_ctx_tgt=args.new + 1, seed=0)
    model = HookedEncoderDecoder(cfg).eval()
    src = torch.randint(3, 64, (args.batch, 64), generator=torch.Generator().manual_seed(0))
    times: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for _ in range(args.repeats):
        for use_cache in (True, False):
            t = time.perf_counter()
            outs[use_cache] = model.generate(src, args.new, use_cache=use_cache, stop_at_eos=False)
            times[use_cache].append(time.perf_counter() - t)
    cached, full = statistics.median(times[True]), statistics.median(times[False])
    ratios = [b / a for a, b in zip(times[True], times[False])]
    result = {"new_tokens": args.new, "batch": args.batch, "threads": args.threads, "repeats": args.repeats,
              "cached_s": round(cached, 4), "uncached_s": round(full, 4),
              "speedup_median_of_pairs": round(statistics.median(ratios), 2),
              "same_tokens": bool(torch.equal(outs[True], outs[False])), "torch": torch.__version__,
              "loadavg_1min": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"greedy decoding of {args.new} tokens, batch {args.batch}, {args.threads} thread(s), median of "
          f"{args.repeats} alternated runs (1-min load {result['loadavg_1min']})")
    print(f"  with the key/value cache:  {cached * 1e3:8.1f} ms")
    print(f"  whole prefix every step:   {full * 1e3:8.1f} ms")
    print(f"  speed-up (median of pairs): {result['speedup_median_of_pairs']}x; same tokens: {result['same_tokens']}")


if __name__ == "__main__":
    main()
