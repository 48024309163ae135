#!/usr/bin/env python3
"""make eval: answer quality and time to first token of full prefill, prefix
caching, full KV reuse and CacheBlend on a QA set, through the real programs.

Input: a JSON list, or JSON Lines, of {question, answers: [...], ctxs: [{title,
text}]} (the format of ../shared/data/musique_s.json). Each question's chunks
come from its first --passages passages, in one of three shapes (--shape):
  paper  the passages themselves (MuSiQue's: ~550 tokens each), as the paper;
  many   the passages split at sentence ends into chunks of 100 to 150 tokens
         (each chunk's target drawn from that range by a generator seeded with
         the question's number; tokens counted as 1.35 a word), then as many
         of those not holding a gold answer dropped, seeded, as leave
         --chunks-max (default 20) in their order;
  short  the passages cut to ~50 tokens: from the first sentence holding a gold
         answer (else the first sentence), 50 tokens' worth of words.
Every chunk is precomputed into a store with cb-precompute, each passage a
document ("doc"; its pieces numbered by "seq"); with --context, cb-precompute
--context also stores each piece as computed after the piece before it,
which cb-run uses where the two come in that order (the many shape keeps a
passage's pieces in order; those dropped break the runs).  Then cb-run
answers with each mode (MODE/OPT=V: with cb-run --OPT V, or --tune OPT=V where
OPT is a key of cb-run --tune help, as reuse/no-context;
"default": blend at cb-run's own settings, the ratio its --speedup picks; and
each blend ratio and strategy, NAME/OPT=V alike), greedily, and
each mode's first-token distribution (cb-run --logits-out) is compared with
full prefill's; with --score, a second run per mode scores the first gold
answer (cb-run --score: its mean NLL per token after the prompt).

Prints a markdown table per mode, strategy and ratio: F1 and exact match
(SQuAD normalization, max over gold answers), F1's paired differences from
full prefill's and from reuse's (the same questions); answers identical to full;
first-token top-1 agreement and mean KL to full; the gold answer's mean NLL,
its mean gap to full and mean absolute gap; recovery = (reuse - blend) /
(reuse - full) of the mean KL and of the mean absolute NLL gap (the share of what full KV reuse loses that the
blend wins back); mean TTFT and speedup over full.  Writes the per-question
results as JSON and, with gnuplot, the ratio sweep: F1 (with its standard
error), answers identical to full's, KL recovery and NLL recovery against
TTFT, a line per strategy.  --no-answers skips generation (F1, EM
and identity are then not measured): the sweep needs only the scoring run.
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


SENT = re.compile(r"(?<=[.!?])\s+(?=\S)")


def ntok(text):
    """Tokens, estimated: 1.35 per word (Qwen2.5's and SmolLM2's BPE on
    MuSiQue's English measure 1.3-1.4)."""
    return 1.35 * len(text.split())


def answer_test(q):
    """Whether a text holds one of question q's gold answers (normalized)."""
    golds = [normalize(a) for a in q["answers"] if normalize(a)]
    return lambda t: any(g in normalize(t) for g in golds)


def make_chunks(q, qi, shape, passages, chunks_max=20, sources=False):
    """The chunk texts of question q (number qi) in the given shape; with
    sources, (text, passage, piece) for each: its passage's number and its
    place among the pieces that passage was split into (as cb-chunk's "doc"
    and "seq")."""
    import random
    ctxs = q["ctxs"][:passages]
    has_gold = answer_test(q)
    if shape == "paper":
        out = [f"{c.get('title', '')}\n{c['text']}".strip() for c in ctxs]
        return [(t, i, 0) for i, t in enumerate(out)] if sources else out
    rng = random.Random(qi)
    out, src = [], []
    for pi, c in enumerate(ctxs):
        n0 = len(out)
        sents = [x for x in SENT.split(c["text"].strip()) if x]
        title = c.get("title", "").strip()
        if shape == "short":
            # from the first sentence holding a gold answer (else the first), ~50 tokens' worth
            first = next((i for i, x in enumerate(sents) if has_gold(x)), 0)
            words, text = [], " ".join(sents[first:]).split()
            for w in text:
                if ntok(" ".join(words + [w])) > 50:
                    break
                words.append(w)
            out.append(f"{title}\n{' '.join(words)}".strip())
            src.append((pi, 0))
            continue
        # many: sentences grouped up to a target size drawn from [100, 150] tokens
        cur, target = [], rng.uniform(100, 150)
        for x in sents:
            if cur and ntok(" ".join(cur + [x])) > target:
                out.append(" ".join(cur))
                cur, target = [], rng.uniform(100, 150)
            cur.append(x)
        if cur and out and ntok(" ".join(cur)) < 50:  # a short tail joins the chunk before it
            out[-1] += " " + " ".join(cur)
        elif cur:
            out.append(" ".join(cur))
        src += [(pi, k) for k in range(len(out) - n0)]
    if shape == "many" and len(out) > chunks_max:
        drop = [i for i, t in enumerate(out) if not has_gold(t)]
        rng.shuffle(drop)
        gone = set(drop[: len(out) - chunks_max])
        keep = [i for i in range(len(out)) if i not in gone][:chunks_max]
        out, src = [out[i] for i in keep], [src[i] for i in keep]
    return [(t, p, k) for t, (p, k) in zip(out, src)] if sources else out


def precompute(pre, store, kv_type, common, qchunks, work, context=False):
    """Every chunk of every question (qchunks: {question number: chunk texts,
    or make_chunks' (text, passage, piece) sources}) into the store with
    cb-precompute, each passage a document (with context, cb-precompute
    --context: a piece also after the one before it); the seconds it took.
    common carries --system when given: cb-precompute then stores that
    prompt's head, which cb-run --no-store-write would compute every time."""
    allf = os.path.join(work, "all.jsonl")
    with open(allf, "w", encoding="utf-8") as f:
        for qi, chunks in qchunks.items():
            for ci, c in enumerate(chunks):
                t, doc, seq = c if isinstance(c, tuple) else (c, ci, 0)
                f.write(json.dumps({"doc": f"q{qi}p{doc}", "seq": seq, "text": t}, ensure_ascii=False) + "\n")
    t0 = time.time()
    subprocess.run([pre, "--store", store, "--kv-type", kv_type, "-q"] + (["--context"] if context else [])
                   + common + [allf], stdout=subprocess.DEVNULL, check=True)
    return time.time() - t0


def question_text(q, cue=""):
    return f"Answer the question with a few words, based on the passages above.\nQuestion: {q['question']}{cue}"


def first_line(ans):
    ans = ans.strip()
    return ans.split("\n")[0].strip() if ans else ""


def plot(rows, work, png):
    """The ratio sweep against mean TTFT, a line per strategy (points in
    ratio order), with full and reuse as references: F1 (with the paired
    standard error of its difference from full's) and the share of answers
    identical to full's (when answers were generated), the KL recovery, and
    the NLL recovery (when scored)."""
    strategies = sorted({r["strategy"] for r in rows if r["mode"] == "blend" and r["ratio"] is not None})
    # references, as labelled points: full, reuse, and the runs at cb-run's own ratio (default)
    refs = [r for r in rows if r["mode"] in ("full", "reuse", "default") or (r["mode"] == "blend" and r["ratio"] is None)]
    dat = os.path.join(work, "plot.dat")
    with open(dat, "w") as f:
        for s in strategies:
            f.write(f"# {s}\n")
            for r in sorted((r for r in rows if r["strategy"] == s and r["ratio"] is not None), key=lambda r: r["ratio"]):
                f.write(f"{r['ttft_ms']:.1f} {100 * r['kl_recovery']:.2f} {100 * r['nll_recovery']:.2f} "
                        f"{r['f1']:.4f} {r['f1_diff_se']:.4f} {100 * r['identical']:.1f} \"{r['ratio']:g}\"\n")
            f.write("\n\n")
        for r in refs:
            if r["mode"] in ("full", "reuse"):
                kl = nll = 100 * (r["mode"] == "full")
            else:
                kl, nll = 100 * r["kl_recovery"], 100 * r["nll_recovery"]
            f.write(f"# {r['config']}\n{r['ttft_ms']:.1f} {kl:.2f} {nll:.2f} {r['f1']:.4f} "
                    f"{r['f1_diff_se'] if r['mode'] != 'full' else 0:.4f} {100 * r['identical']:.1f} "
                    f"\"{r['config']}\"\n\n\n")
    n = len(strategies)
    def lines(col, bars=False):
        return ", ".join(
            [f"'{dat}' index {i} using 1:{col} with linespoints lw 2 pt 7 title '{s.replace('@', ' mass ')}', "
             f"'' index {i} using 1:{col}:7 with labels offset 0,0.8 notitle" for i, s in enumerate(strategies)]
            + ([f"'{dat}' index 0:{n + len(refs) - 1} using 1:{col}:5 with yerrorbars lc rgb 'gray' pt 0 notitle"]
               if bars else [])
            + [f"'{dat}' index {n}:{n + len(refs) - 1} using 1:{col}:7 with labels point pt 5 offset 0,-0.8 notitle"])
    nll = any(r["nll_recovery"] == r["nll_recovery"] for r in rows)  # scored (--score): not all NaN
    ans = any(r["identical"] == r["identical"] for r in rows)  # answers generated (not --no-answers)
    panels = 2 + nll + ans
    script = (f"set terminal png size {700 * panels},600; set output '{png}'; set multiplot layout 1,{panels};"
              "set xlabel 'mean TTFT (ms)'; set grid; set key bottom right;"
              + ("set title 'F1 vs TTFT (labels: ratio; bars: paired standard error of the difference from full)';"
                 f"set ylabel 'F1'; plot {lines(4, True)};"
                 "set title 'answers identical to full prefill vs TTFT'; set ylabel 'identical (%)';"
                 f"set yrange [-5:105]; plot {lines(6)};" if ans else "")
              + "set yrange [-20:110];"
              f"set title 'first-token KL recovery vs TTFT'; set ylabel 'KL recovery (%)'; plot {lines(2)};"
              + (f"set title 'gold-answer NLL recovery vs TTFT'; set ylabel 'NLL recovery (%)'; plot {lines(3)};"
                 if nll else "")
              + "unset multiplot")
    subprocess.run(["gnuplot", "-e", script], check=False)


def report(args, configs, results, n_q, work, pre_s):
    """Print the table of results (and write them and the plot)."""
    def label(c):
        return (c[0] if not c[2] else f"{c[0]} {c[2]}") if c[1] is None else f"blend r={c[1]:g} {c[2]}"

    def mean(rs, k):
        return sum(r[k] for r in rs) / len(rs) if rs else float("nan")

    def recovery(reuse, full, x):
        return (reuse - x) / (reuse - full) if reuse - full > 1e-12 else float("nan")

    by = {c: [r for r in results if (r["mode"], r["ratio"], r["strategy"]) == c] for c in configs}
    # recovery's reference: plain reuse, else the first reuse configured (reuse/no-context)
    fr = by.get(("full", None, None), [])
    rr = by.get(("reuse", None, None)) or next((by[c] for c in configs if c[0] == "reuse"), [])
    mean_full, mean_full_f1 = mean(fr, "ttft_ms"), mean(fr, "f1")
    kl_reuse, gap_reuse = mean(rr, "kl"), mean(rr, "nll_absgap")
    rows = []
    print(f"\n{n_q} questions, shape {getattr(args, 'shape', 'paper')}, {args.passages} passages each, mean prompt "
          f"{sum(r['n_prompt_tokens'] for r in results) / len(results):.0f} tokens; model "
          f"{os.path.basename(args.model or os.environ.get('CB_MODEL') or 'default')}; {args.threads} threads; KV {args.kv_type}\n")
    def se(xs):
        xs = [x for x in xs if x == x]
        if len(xs) < 2:
            return float("nan")
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    ctx = [r for r in results if r["mode"] in ("reuse", "blend") and r.get("n_chunks")
           and "no-context" not in (r["strategy"] or "")]
    if ctx and any(r.get("n_chunks_after") for r in ctx):
        print(f"chunks cached after the piece before them (--context): "
              f"{sum(r['n_chunks_after'] for r in ctx) / sum(r['n_chunks'] for r in ctx):.0%} of the chunks\n")
    full_f1, reuse_f1 = {r["q"]: r["f1"] for r in fr}, {r["q"]: r["f1"] for r in rr}
    print("| mode | F1 (+- s.e.) | F1 - full's (+- s.e., paired) | F1 kept | F1 - reuse's (paired) | EM | identical to full | top-1 = full | "
          "KL | KL recovery | gold NLL | NLL gap | abs NLL gap | NLL recovery | recomputed | TTFT ms | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        rs = by[c]
        kl, gap, agap = mean(rs, "kl"), mean(rs, "nll_gap"), mean(rs, "nll_absgap")
        row = {"config": label(c), "mode": c[0], "ratio": c[1], "strategy": c[2], "f1": mean(rs, "f1"),
               "em": mean(rs, "em"), "identical": mean(rs, "same"),
               "top1": sum(1 for r in rs if r["top1"]) / len(rs), "kl": kl,
               "kl_recovery": recovery(kl_reuse, 0.0, kl), "nll": mean(rs, "nll"), "nll_gap": gap,
               "nll_absgap": agap, "nll_recovery": recovery(gap_reuse, 0.0, agap),
               "recomputed": sum(r["n_recomputed_tokens"] for r in rs) / max(1, sum(r["n_cached_tokens"] for r in rs)),
               "ttft_ms": mean(rs, "ttft_ms"), "speedup": mean_full / mean(rs, "ttft_ms")}
        diffs = [r["f1"] - full_f1[r["q"]] for r in rs if r["q"] in full_f1]
        row["f1_se"], row["f1_diff"], row["f1_diff_se"] = se([r["f1"] for r in rs]), mean(
            [{"d": d} for d in diffs], "d"), se(diffs)
        row["f1_kept"] = row["f1"] / mean_full_f1 if mean_full_f1 > 0 else float("nan")
        # "never below reuse": the same questions' F1 against the reuse run's
        vs_reuse = [r["f1"] - reuse_f1[r["q"]] for r in rs if r["q"] in reuse_f1]
        row["f1_vs_reuse"], row["f1_vs_reuse_se"] = mean([{"d": d} for d in vs_reuse], "d"), se(vs_reuse)
        rows.append(row)
        print(f"| {row['config']} | {row['f1']:.3f} +- {row['f1_se']:.3f} | {row['f1_diff']:+.3f} +- {row['f1_diff_se']:.3f} | "
              f"{row['f1_kept']:.0%} | {row['f1_vs_reuse']:+.3f} +- {row['f1_vs_reuse_se']:.3f} | {row['em']:.3f} | {row['identical']:.0%} | {row['top1']:.0%} | "
              f"{kl:.4f} | {row['kl_recovery']:.1%} | {row['nll']:.3f} | {gap:+.3f} | {agap:.3f} | {row['nll_recovery']:.1%} | "
              f"{row['recomputed']:.1%} | {row['ttft_ms']:.0f} | {row['speedup']:.2f}x |")
    print(f"\n(full prefill F1 {mean_full_f1:.3f}; recovery = (reuse - x) / (reuse - full) of the mean KL and of "
          "the mean absolute NLL gap; recomputed = recomputed / cached tokens)")
    json.dump({"args": vars(args), "precompute_s": pre_s, "summary": rows, "results": results},
              open(args.out, "w"), indent=1)
    print(f"\nresults: {args.out}", file=sys.stderr)
    if args.plot and shutil.which("gnuplot"):
        plot(rows, work, os.path.abspath(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)


def tune_keys(run):
    """The keys of cb-run's --tune (cb-run --tune help: a line each, KEY=VALUE first)."""
    out = subprocess.run([run, "--tune", "help"], stdout=subprocess.PIPE, check=True).stdout.decode()
    return {line.split()[0].partition("=")[0] for line in out.splitlines() if line.strip()}


def run_opts(opts, tune):
    """A configuration's OPT=V (or OPT) as cb-run's arguments: --tune OPT=V for a key of
    --tune (tune), else --OPT V."""
    args = []
    for o in opts:
        k, _, v = o.partition("=")
        args += ["--tune", o] if k in tune else [f"--{k}"] + ([v] if v else [])
    return args


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(top, "..", "shared", "data", "musique_s.json"))
    ap.add_argument("-n", "--questions", type=int, default=30)
    ap.add_argument("--first", type=int, default=0,
                    help="skip the set's first N questions (numbers, chunk seeds and store keys stay the set's own: "
                    "a long run split over several runs pools)")
    ap.add_argument("--passages", type=int, default=6)
    ap.add_argument("--shape", choices=["paper", "many", "short"], default="paper",
                    help="the chunks: the passages (paper), 20 sentence-aligned chunks of 100-150 tokens (many), "
                    "the passages cut to ~50 tokens around the answer (short)")
    ap.add_argument("--chunks-max", type=int, default=20, help="many: the chunks kept")
    ap.add_argument("--score", action="store_true",
                    help="also score the gold answer (cb-run --score: its NLL; one more run per mode)")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--ratios", default="0.15", help="blend ratios, comma-separated")
    ap.add_argument("--strategies", default="auto,probe,hkvd,runs",
                    help="comma-separated; probe@M: probe with --tune mass=M and the ratio as max-ratio; "
                    "NAME/OPT=V/...: with cb-run --OPT V or --tune OPT=V (e.g. hkvd/check-layer=5, "
                    "probe/probe-rows=0)")
    ap.add_argument("--modes", default="full,prefix,reuse,default,blend",
                    help="MODE/OPT=V/...: that mode with cb-run --OPT V or --tune OPT=V (reuse/no-context); "
                    "default: blend at "
                    "cb-run's own settings (the ratio --speedup picks); blend: the sweep of --ratios x --strategies")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bin", default=os.path.join(top, "bin"))
    ap.add_argument("--out", default="eval-results.json")
    ap.add_argument("--plot", default="eval-quality-ttft.png")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--no-answers", action="store_true", help="score only: no generation, no F1/EM")
    ap.add_argument("--extra", default="", help="extra cb-run flags for blend runs")
    ap.add_argument("--system", default=None,
                    help="cb-run --system TEXT for every mode (default: the chat template's own system "
                    "message); cb-precompute stores that prompt's head")
    ap.add_argument("--for-system", action="store_true",
                    help="with --system: precompute the chunks after that prompt's head (cb-precompute "
                    "--for-system), not after the template's default one")
    ap.add_argument("--context", action="store_true",
                    help="precompute each piece of a passage also after the piece before it (cb-precompute "
                    "--context; the many shape splits passages into pieces)")
    ap.add_argument("--store", default=None,
                    help="keep the passages' KV in this store (created if missing; reruns skip what it has)")
    ap.add_argument("--table-from", default=None,
                    help="print the table of a results file (--out of an earlier or interrupted run); "
                    "its table JSON and plot go beside it unless --plot is given")
    args = ap.parse_args()
    if args.table_from:
        saved = json.load(open(args.table_from))
        results, configs = saved["results"], []
        for r in results:
            if (r["mode"], r["ratio"], r["strategy"]) not in configs:
                configs.append((r["mode"], r["ratio"], r["strategy"]))
        configs.sort(key=lambda c: c[0] != "full")
        vars(args).update({k: v for k, v in saved["args"].items()
                           if k in ("passages", "model", "threads", "kv_type", "shape")})
        args.out = args.table_from + ".table.json"
        if args.plot == ap.get_default("plot"):  # beside the results, not in the current directory
            args.plot = args.table_from + ".png"
        work = tempfile.mkdtemp(prefix="cb-eval-")
        try:
            report(args, configs, results, len({r["q"] for r in results}), work, saved.get("precompute_s", 0.0))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return

    if not os.path.exists(args.data):
        sys.exit(f"eval: {args.data}: no such file (give --data)")
    qa = list(enumerate(load_qa(args.data)))[args.first: args.first + args.questions]
    run, pre = os.path.join(args.bin, "cb-run"), os.path.join(args.bin, "cb-precompute")
    common = (["-t", str(args.threads)] + (["-m", args.model] if args.model else [])
              + (["--system", args.system] if args.system is not None else []))
    work = tempfile.mkdtemp(prefix="cb-eval-")
    store = os.path.abspath(args.store) if args.store else os.path.join(work, "store")
    try:
        # every passage of every question, precomputed once
        qsrc = {qi: make_chunks(q, qi, args.shape, args.passages, args.chunks_max, sources=True) for qi, q in qa}
        qchunks = {qi: [c[0] for c in cs] for qi, cs in qsrc.items()}
        if args.for_system and args.system is None:
            sys.exit("eval.py: --for-system needs --system")
        pcommon = common  # --system (common's last two) becomes --for-system: the chunks after its head
        if args.for_system:
            pcommon = common[:common.index("--system")] + ["--for-system", args.system]
        pre_s = precompute(pre, store, args.kv_type, pcommon, qsrc, work, args.context)
        print(f"precomputed {sum(map(len, qchunks.values()))} passages in {pre_s:.1f} s", file=sys.stderr)

        # a model without a chat template (Gemma-3-270M is a base model) is
        # cued to answer; an instruction-tuned one asked in its chat format
        probe = os.path.join(work, "probe.json")
        subprocess.run([run, "-p", "x", "-n", "1", "--stats", probe] + common, stdout=subprocess.DEVNULL, check=True)
        cue = "\nAnswer:" if json.load(open(probe)).get("chat_template") == "none" else ""
        tune = tune_keys(run)

        configs = []
        for mode in args.modes.split(","):
            if mode == "blend":
                for r in args.ratios.split(","):
                    for s in args.strategies.split(","):
                        configs.append(("blend", float(r), s))
            else:  # MODE/OPT=V...: cb-run's option or knob (reuse/no-context); default: blend as its defaults have it
                name, _, opts = mode.partition("/")
                configs.append((name, None, opts or None))
        results = []
        for done, (qi, q) in enumerate(qa):
            chunks = os.path.join(work, f"q{qi}.jsonl")
            with open(chunks, "w", encoding="utf-8") as f:
                for t in qchunks[qi]:
                    f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            question = question_text(q, cue)
            full_logits = full_answer = full_nll = None
            for mode, ratio, strat in sorted(configs, key=lambda c: c[0] != "full"):
                stats = os.path.join(work, "stats.json")
                lfile = os.path.join(work, "logits.f32")
                cmd = [run, "--store", store, "--chunks", chunks, "--mode", "blend" if mode == "default" else mode,
                       "--temp", "0", "-n",
                       str(args.max_new), "--no-store-write", "--stats", stats, "--logits-out", lfile,
                       "-p", question] + common
                if ratio is None and strat:
                    cmd += run_opts(strat.split("/"), tune)
                if ratio is not None:
                    name, *opts = strat.split("/")  # NAME/OPT=V: cb-run --OPT V or --tune OPT=V
                    name, _, mass = name.partition("@")  # probe@M: mass M, at most the ratio
                    cmd += ["--ratio", str(ratio), "--strategy", name] + (args.extra.split() if args.extra else [])
                    cmd += run_opts(opts, tune)
                    if mass:
                        cmd += ["--tune", f"mass={mass}", "--tune", f"max-ratio={ratio}", "--tune", "min-ratio=0"]
                score = {"nll": float("nan"), "n_tokens": 0, "top1": float("nan")}
                if args.score or args.no_answers:  # the gold answer's score after the prompt (and the first token's logits)
                    subprocess.run(cmd + ["--score", q["answers"][0]], stdout=subprocess.DEVNULL, check=True)
                    st = json.load(open(stats))
                    score = st["score"]
                ans = ""
                if not args.no_answers:  # the answer (and, without --score, the first token's logits)
                    gcmd = cmd if not args.score else [a for a in cmd if a not in ("--logits-out", lfile)]
                    ans = subprocess.run(gcmd, stdout=subprocess.PIPE, check=True).stdout.decode("utf-8", "replace")
                    if not args.score:
                        st = json.load(open(stats))
                pred = first_line(ans)
                res = {
                    "q": qi, "mode": mode, "ratio": ratio, "strategy": strat, "answer": ans,
                    "f1": max(f1(pred, g) for g in q["answers"]),
                    "em": max(float(normalize(pred) == normalize(g)) for g in q["answers"]),
                    "ttft_ms": st["ttft_ms"], "prefill_ms": st["prefill_ms"], "load_ms": st["load_ms"],
                    "n_prompt_tokens": st["n_prompt_tokens"], "n_cached_tokens": st["n_cached_tokens"],
                    "n_recomputed_tokens": st["n_recomputed_tokens"],
                    "n_chunks": st["n_chunks"], "n_chunks_after": st.get("n_chunks_after", 0),
                    "n_chunks_system": st.get("n_chunks_system", 0),
                    "nll": score["nll"], "nll_tokens": score["n_tokens"], "nll_top1": score["top1"],
                }
                logits = read_logits(lfile)
                if mode == "full":
                    full_logits, full_answer, full_nll = logits, ans, score["nll"]
                res["nll_gap"] = res["nll"] - full_nll if full_logits is not None else float("nan")
                res["nll_absgap"] = abs(res["nll_gap"])
                if args.no_answers:
                    res["f1"] = res["em"] = float("nan")
                if full_logits is not None:
                    res["kl"], res["top1"] = kl_top1(full_logits, logits)
                    res["same"] = ans == full_answer if not args.no_answers else float("nan")
                else:  # no full run configured: nothing to compare with
                    res["kl"], res["top1"], res["same"] = float("nan"), False, False
                results.append(res)
            print(f"question {qi + 1} done ({done + 1} of {len(qa)})", file=sys.stderr)
            json.dump({"args": vars(args), "partial": True, "results": results}, open(args.out, "w"), indent=1)

        report(args, configs, results, len(qa), work, pre_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
