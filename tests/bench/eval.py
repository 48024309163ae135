#!/usr/bin/env python3
"""make eval: answer quality and time to first token of full prefill, prefix
caching, full KV reuse and CacheBlend on a QA set, through the real programs.

Input: a JSON list, or JSON Lines, of {question, answers: [...], ctxs: [{title,
text}]} (the format of ../shared/data/musique_s.json). For each question the
first --passages passages become chunks; every chunk is precomputed into a
scratch store with cb-precompute; then cb-run answers with each mode (and each
blend ratio and strategy), greedily; each mode's first-token distribution
(cb-run --logits-out) is compared with full prefill's.

Prints a markdown table (F1 and exact match with SQuAD normalization, max over
gold answers; % answers identical to full; mean first-token KL to full; mean
TTFT; speedup over full), writes the per-question results as JSON and, with
gnuplot, a quality-vs-TTFT plot.
"""
import argparse
import array
import json
import math
import os
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter


def normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1(pred, gold):
    p, g = normalize(pred).split(), normalize(gold).split()
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if not p or not g:
        return float(p == g)
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def read_logits(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def kl_top1(p_logits, q_logits):
    """KL(softmax p || softmax q) and whether the argmaxes agree."""
    mp, mq = max(p_logits), max(q_logits)
    zp = math.fsum(math.exp(x - mp) for x in p_logits)
    zq = math.fsum(math.exp(x - mq) for x in q_logits)
    lzp, lzq = math.log(zp), math.log(zq)
    kl = 0.0
    for a, b in zip(p_logits, q_logits):
        la = a - mp - lzp
        kl += math.exp(la) * (la - (b - mq - lzq))
    ap = max(range(len(p_logits)), key=p_logits.__getitem__)
    aq = max(range(len(q_logits)), key=q_logits.__getitem__)
    return max(kl, 0.0), ap == aq


def load_qa(path):
    text = open(path, encoding="utf-8").read()
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        return [json.loads(l) for l in text.splitlines() if l.strip()]


def first_line(ans):
    ans = ans.strip()
    return ans.split("\n")[0].strip() if ans else ""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(top, "..", "shared", "data", "musique_s.json"))
    ap.add_argument("-n", "--questions", type=int, default=30)
    ap.add_argument("--passages", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--ratios", default="0.15", help="blend ratios, comma-separated")
    ap.add_argument("--strategies", default="hkvd,sink,query")
    ap.add_argument("--modes", default="full,prefix,reuse,blend")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bin", default=os.path.join(top, "bin"))
    ap.add_argument("--out", default="eval-results.json")
    ap.add_argument("--plot", default="eval-quality-ttft.png")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--extra", default="", help="extra cb-run flags for blend runs")
    args = ap.parse_args()

    if not os.path.exists(args.data):
        sys.exit(f"eval: {args.data}: no such file (give --data)")
    qa = load_qa(args.data)[: args.questions]
    run, pre = os.path.join(args.bin, "cb-run"), os.path.join(args.bin, "cb-precompute")
    common = ["-t", str(args.threads)] + (["-m", args.model] if args.model else [])
    work = tempfile.mkdtemp(prefix="cb-eval-")
    store = os.path.join(work, "store")
    try:
        # every passage of every question, precomputed once
        recs = []
        for qi, q in enumerate(qa):
            for pi, c in enumerate(q["ctxs"][: args.passages]):
                recs.append({"doc": f"q{qi}", "seq": pi, "text": f"{c.get('title', '')}\n{c['text']}".strip()})
        allf = os.path.join(work, "all.jsonl")
        with open(allf, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        t0 = time.time()
        subprocess.run([pre, "--store", store, "--kv-type", args.kv_type, "-q"] + common + [allf],
                       stdout=subprocess.DEVNULL, check=True)
        pre_s = time.time() - t0
        print(f"precomputed {len(recs)} passages in {pre_s:.1f} s", file=sys.stderr)

        # a model without a chat template (Gemma-3-270M is a base model) is
        # cued to answer; an instruction-tuned one asked in its chat format
        probe = os.path.join(work, "probe.json")
        subprocess.run([run, "-p", "x", "-n", "1", "--stats", probe] + common, stdout=subprocess.DEVNULL, check=True)
        cue = "\nAnswer:" if json.load(open(probe)).get("chat_template") == "none" else ""

        configs = []
        for mode in args.modes.split(","):
            if mode == "blend":
                for r in args.ratios.split(","):
                    for s in args.strategies.split(","):
                        configs.append(("blend", float(r), s))
            else:
                configs.append((mode, None, None))
        results = []
        for qi, q in enumerate(qa):
            chunks = os.path.join(work, f"q{qi}.jsonl")
            with open(chunks, "w", encoding="utf-8") as f:
                for c in q["ctxs"][: args.passages]:
                    f.write(json.dumps({"text": f"{c.get('title', '')}\n{c['text']}".strip()}, ensure_ascii=False) + "\n")
            question = f"Answer the question with a few words, based on the passages above.\nQuestion: {q['question']}{cue}"
            full_logits = full_answer = None
            for mode, ratio, strat in sorted(configs, key=lambda c: c[0] != "full"):
                stats = os.path.join(work, "stats.json")
                lfile = os.path.join(work, "logits.f32")
                cmd = [run, "--store", store, "--chunks", chunks, "--mode", mode, "--temp", "0", "-n",
                       str(args.max_new), "--no-store-write", "--stats", stats, "--logits-out", lfile,
                       "-p", question] + common
                if ratio is not None:
                    cmd += ["--ratio", str(ratio), "--strategy", strat] + (args.extra.split() if args.extra else [])
                ans = subprocess.run(cmd, stdout=subprocess.PIPE, check=True).stdout.decode("utf-8", "replace")
                st = json.load(open(stats))
                pred = first_line(ans)
                res = {
                    "q": qi, "mode": mode, "ratio": ratio, "strategy": strat, "answer": ans,
                    "f1": max(f1(pred, g) for g in q["answers"]),
                    "em": max(float(normalize(pred) == normalize(g)) for g in q["answers"]),
                    "ttft_ms": st["ttft_ms"], "prefill_ms": st["prefill_ms"], "load_ms": st["load_ms"],
                    "n_prompt_tokens": st["n_prompt_tokens"], "n_cached_tokens": st["n_cached_tokens"],
                    "n_recomputed_tokens": st["n_recomputed_tokens"],
                }
                logits = read_logits(lfile)
                if mode == "full":
                    full_logits, full_answer = logits, ans
                if full_logits is not None:
                    res["kl"], res["top1"] = kl_top1(full_logits, logits)
                    res["same"] = ans == full_answer
                else:  # no full run configured: nothing to compare with
                    res["kl"], res["top1"], res["same"] = float("nan"), False, False
                results.append(res)
            print(f"question {qi + 1}/{len(qa)} done", file=sys.stderr)

        # the table
        def label(c):
            return c[0] if c[1] is None else f"blend r={c[1]:g} {c[2]}"

        full_ttft = [r["ttft_ms"] for r in results if r["mode"] == "full"]
        mean_full = sum(full_ttft) / len(full_ttft) if full_ttft else float("nan")
        full_f1 = [r["f1"] for r in results if r["mode"] == "full"]
        mean_full_f1 = sum(full_f1) / len(full_f1) if full_f1 else float("nan")
        rows = []
        print(f"\n{len(qa)} questions, {args.passages} passages each, mean prompt "
              f"{sum(r['n_prompt_tokens'] for r in results) / len(results):.0f} tokens; model "
              f"{os.path.basename(args.model or os.environ.get('CB_MODEL') or 'default')}; {args.threads} threads; KV {args.kv_type}\n")
        print("| mode | F1 | EM | F1 / full | identical to full | first-token top-1 = full | mean first-token KL | mean TTFT ms | speedup |")
        print("|---|---|---|---|---|---|---|---|---|")
        for c in configs:
            rs = [r for r in results if (r["mode"], r["ratio"], r["strategy"]) == c]
            n = len(rs)
            mf1 = sum(r["f1"] for r in rs) / n
            mem = sum(r["em"] for r in rs) / n
            same = sum(1 for r in rs if r["same"]) / n
            top1 = sum(1 for r in rs if r["top1"]) / n
            kl = sum(r["kl"] for r in rs) / n
            ttft = sum(r["ttft_ms"] for r in rs) / n
            row = {"config": label(c), "f1": mf1, "em": mem, "f1_vs_full": mf1 / mean_full_f1 if mean_full_f1 else 0,
                   "identical": same, "top1": top1, "kl": kl, "ttft_ms": ttft, "speedup": mean_full / ttft}
            rows.append(row)
            print(f"| {row['config']} | {mf1:.3f} | {mem:.3f} | {row['f1_vs_full']:.1%} | {same:.0%} | {top1:.0%} | {kl:.4f} | "
                  f"{ttft:.0f} | {row['speedup']:.2f}x |")
        json.dump({"args": vars(args), "precompute_s": pre_s, "summary": rows, "results": results},
                  open(args.out, "w"), indent=1)
        print(f"\nresults: {args.out}", file=sys.stderr)
        if args.plot and shutil.which("gnuplot"):
            dat = os.path.join(work, "plot.dat")
            with open(dat, "w") as f:
                for r in rows:
                    f.write(f"{r['ttft_ms']:.1f} {r['f1']:.4f} \"{r['config']}\"\n")
            script = (f"set terminal png size 900,600; set output '{os.path.abspath(args.plot)}';"
                      "set xlabel 'mean TTFT (ms)'; set ylabel 'F1'; set grid; set key off;"
                      "set title 'answer quality vs time to first token';"
                      f"plot '{dat}' using 1:2 with points pt 7 ps 2, '' using 1:2:3 with labels offset 0,1")
            subprocess.run(["gnuplot", "-e", script], check=False)
            print(f"plot: {args.plot}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
