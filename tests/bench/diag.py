#!/usr/bin/env python3
"""Where a blend's quality goes (issue 31 item 2), layer by layer.

Builds shapes.py's prompts (--shape paper|many|short from ../shared/data/
musique_s.json), precomputes every chunk into a store (--store keeps it
between runs), and runs build/*/bench/blend_diag on them: full prefill
against reuse and each blend (--modes reuse,probe:0.15,...), with the
question turn run again against the cache each one left. Prints, per mode,
the first answer token's KL to full and, for a few layers, the question's
attention split (prompt head = the sink, chunks' first 4 tokens, the chunk
holding the answer, the other chunks, separators, itself), its total
variation from full's, the cosine of its last hidden state with full's, and
how far the chunks' cached K and V are from full prefill's; and which
chunks the question attends to: how often a gold chunk is among the k most
attended (recall@k, the mean over every layer and over the first half, where
probe's first pass scores) and how many of full prefill's 5 most attended
chunks each mode's 5 are.
With --chunks-list 1,2,5,20 the same with only the first k chunks of each
question (the gold ones among them): how quality moves with their number.
How stale reuse's rows are, by their place in the chunk and by chunk.
The headroom of selection: the oracle modes recompute rows picked by what
only full prefill knows, as probe's second pass does (--modes
reuse,probe:0.22,oatt:0.22,odev:0.22,ostale:0.22,ovdev:0.22,oprobe:0.22):
  oatt    the question's attention in full prefill times |V_full| (probe's
          score, had it the true cache)
  odev    that attention times |V_full - V| (what a stale row changes in the
          heads' outputs)
  ostale  the question's attention over the loaded caches times |V_full - V|
  ovdev   |V_full - V| alone (hkvd's deviation, every layer, the true one)
  oprobe  probe's own score through the same path (a check: probe's KL)
and oiter: probe's score in two rounds (half the rows recomputed, then the
question's attention over that cache picks the rest; about 1.5 blends);
pshr:R:S: probe's rows with a budget that shrinks with depth, (1 + S) x
R's at layer 0 to (1 - S) x at the last (the same rows computed in all);
late:R:K: probe's rows recomputed from layer K on only, starting from the
hidden state each had there when its chunk was computed alone (what storing
that state beside the KV would save: K of the layers of a recomputed row).
The blends run without the stale scale (cb-run --tune stale-scale) unless the
mode gives it: probe:0.2:0:0.35.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes as ev  # noqa: E402


def mean(xs):
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def se(xs):
    xs = [x for x in xs if x == x]
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def table(lines, modes, n_layer, title):
    print(f"\n### {title}\n")
    print("| mode | KL to full (+- s.e.) | top-1 | recomputed | mean TV | mean cos |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        ls = [x for x in lines if x["mode"] == mode]
        if not ls:
            continue
        kl = [x.get("kl", 0.0) for x in ls]
        print(f"| {mode} | {mean(kl):.3f} +- {se(kl):.3f} | {mean([float(x.get('top1', True)) for x in ls]):.2f} "
              f"| {mean([x['n_recomputed'] for x in ls]):.0f} of {mean([x['n_tokens'] for x in ls]):.0f} "
              f"| {mean([mean(x['tv']) for x in ls]):.3f} | {mean([mean(x['cos']) for x in ls]):.3f} |")
    stale = [x for x in lines if x["mode"] == "reuse" and "vdev_pos" in x]
    if stale:  # how stale a loaded row's V is, by its place (blend_diag's vdev_pos, vdev_chunk)
        places = ["0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128-255", "256-511", "512+"]
        print("\nreuse: ||V - V_full|| / ||V_full|| of the chunks' rows (mean over rows and layers) by the row's "
              "place in its chunk (the chunks not true prefixes), and by chunk (0: the first)\n")
        print("| place | " + " | ".join(places) + " |\n|" + "---|" * (len(places) + 1))
        print("| vdev | " + " | ".join(f"{mean([x['vdev_pos'][i] for x in stale if x['vdev_pos'][i] > 0]):.3f}"
                                      for i in range(len(places))) + " |")
        nc = max(len(x["vdev_chunk"]) for x in stale)
        print("\n| chunk | " + " | ".join(str(c) for c in range(nc)) + " |\n|" + "---|" * (nc + 1))
        print("| vdev | " + " | ".join(f"{mean([x['vdev_chunk'][c] for x in stale if len(x['vdev_chunk']) > c]):.3f}"
                                      for c in range(nc)) + " |")
    picks = sorted({0, 1, n_layer // 4, n_layer // 2, 3 * n_layer // 4, n_layer - 1})
    keys = ["prefix", "heads", "gold", "other", "sep", "self", "tv", "cos", "kdev", "vdev", "kdev_gold",
            "kdev_heads", "knorm", "kcos", "vnorm", "vcos"]
    for mode in modes:
        ls = [x for x in lines if x["mode"] == mode]
        if not ls:
            continue
        print(f"\n{mode}: the question's attention by layer (shares of its mass), its distance from full's;"
              f" layer 0's K of the moved chunks against full's: {max(x.get('kdev0', 0) for x in ls):.2e} at most\n")
        print("| layer | " + " | ".join(keys) + " |")
        print("|" + "---|" * (len(keys) + 1))
        for l in picks:
            row = [mean([x[k][l] for x in ls]) for k in keys]
            print(f"| {l} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    ranks(lines, modes)


def top(xs, k):
    return set(sorted(range(len(xs)), key=lambda i: (-xs[i], i))[:k])


def ranks(lines, modes):
    """A gold chunk's rank by the question's attention, per mode."""
    full = {x["q"]: x for x in lines if x["mode"] == "full"}
    print("\nwhich chunks the question attends to (questions with a gold chunk; recall@k: a gold chunk "
          "among the k most attended; top-5 overlap: of full prefill's 5 most attended chunks)\n")
    print("| mode | layers | questions | recall@1 | recall@3 | recall@5 | recall@8 | top-5 overlap with full |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        ls = [x for x in lines if x["mode"] == mode and x.get("gold_rank", -1) >= 0]
        for key, name in (("", "all"), ("_half", "first half")):
            if not ls:
                continue
            rk = [x["gold_rank" + key] for x in ls]
            ov = [len(top(x["chunk_mass" + key], 5) & top(full[x["q"]]["chunk_mass" + key], 5))
                  for x in ls if x["q"] in full]
            print(f"| {mode} | {name} | {len(ls)} | " + " | ".join(f"{mean([float(r < t) for r in rk]):.2f}"
                                                                for t in (1, 3, 5, 8)) + f" | {mean(ov):.1f} of 5 |")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(top, "..", "shared", "data", "musique_s.json"))
    ap.add_argument("-n", "--questions", type=int, default=8)
    ap.add_argument("--first", type=int, default=0, help="skip the first questions")
    ap.add_argument("--passages", type=int, default=6)
    ap.add_argument("--shape", choices=["paper", "many", "short"], default="many")
    ap.add_argument("--chunks-max", type=int, default=20)
    ap.add_argument("--chunks-list", default="", help="also with the first k chunks, k in this list")
    ap.add_argument("--modes", default="reuse,probe:0.15",
                    help="reuse, STRATEGY:R[:DEPTH] (probe, hkvd, query), ORACLE:R (oatt, odev, ostale, ovdev, oprobe), oiter:R, pshr:R:S, late:R:K")
    ap.add_argument("--model", default=os.environ.get("CB_MODEL") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cacheblend", "models",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), help="default: $CB_MODEL (make diag MODEL=...), else Qwen2.5-Coder-1.5B")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bin", default=os.path.join(top, "bin"))
    ap.add_argument("--diag", default=os.path.join(top, "build", "rel", "bench", "blend_diag"),
                    help="the blend_diag binary (make builds it under $(BUILD)/bench)")
    ap.add_argument("--store", default=None)
    ap.add_argument("--out", default="diag-results.jsonl")
    args = ap.parse_args()

    if not os.path.exists(args.data):
        sys.exit(f"diag: {args.data}: no such file (give --data)")
    qa = ev.load_qa(args.data)[args.first: args.first + args.questions]
    work = tempfile.mkdtemp(prefix="cb-diag-")
    try:
        run(args, qa, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, qa, work):
    store = os.path.abspath(args.store) if args.store else os.path.join(work, "store")
    common = ["-t", str(args.threads), "-m", args.model]
    qs, qchunks = [], {}
    for i, q in enumerate(qa):
        qi = args.first + i
        chunks = qchunks[qi] = ev.make_chunks(q, qi, args.shape, args.passages, args.chunks_max)
        has_gold = ev.answer_test(q)
        gold = [ci for ci, t in enumerate(chunks) if has_gold(t)]
        qs.append({"question": ev.question_text(q), "chunks": chunks, "gold": gold})
    ev.precompute(os.path.join(args.bin, "cb-precompute"), store, "f16", common, qchunks, work)
    ks = [int(k) for k in args.chunks_list.split(",") if k] or [0]
    modes = ["full"] + args.modes.split(",")
    out = open(args.out, "w")
    by_k = {}
    for k in ks:
        qf = os.path.join(work, f"q{k}.jsonl")
        with open(qf, "w", encoding="utf-8") as f:
            for q in qs:
                c = q["chunks"][:k] if k else q["chunks"]
                f.write(json.dumps({"question": q["question"], "chunks": c,
                                    "gold": [g for g in q["gold"] if g < len(c)]}, ensure_ascii=False) + "\n")
        print(f"blend_diag: {len(qs)} questions, {k or 'all'} chunks each", file=sys.stderr)
        res = subprocess.run([args.diag, args.model, store, str(args.threads), qf] + modes[1:],
                             stdout=subprocess.PIPE, check=True).stdout.decode()
        lines = [json.loads(x) for x in res.splitlines() if x.strip()]
        for x in lines:
            x["k"] = k
            out.write(json.dumps(x) + "\n")
        by_k[k] = lines
    out.close()
    n_layer = len(by_k[ks[0]][0]["tv"])
    print(f"# blend diagnosis: {os.path.basename(args.model)}, shape {args.shape}, {len(qs)} questions "
          f"(from {args.first}), modes {', '.join(modes)}")
    for k in ks:
        table(by_k[k], modes, n_layer, f"{k or 'all'} chunks")
    if len(ks) > 1:
        print("\n### KL to full (and the question's mean attention TV from full's) by the number of chunks\n")
        print("| chunks | " + " | ".join(modes[1:]) + " |")
        print("|" + "---|" * len(modes))
        for k in ks:
            row = [[x for x in by_k[k] if x["mode"] == m] for m in modes[1:]]
            print(f"| {k} | " + " | ".join(f"{mean([x['kl'] for x in ls]):.3f} ({mean([mean(x['tv']) for x in ls]):.3f})"
                                          for ls in row) + " |")


if __name__ == "__main__":
    main()
