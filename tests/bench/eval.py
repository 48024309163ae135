#!/usr/bin/env python3
"""make eval: how often a blend gives full prefill's answer, with intervals.

The claim under test is that cb-run's blend answers as full prefill does.
Each question's passages are chunks, precomputed once (cb-precompute
--for-system S) into a store kept in the eval's cache; then cb-run answers
the question (greedy, --system S, -n 16) in each mode, and every mode is
compared with full prefill on the same question:

  agreement   the first answer line equals full prefill's after SQuAD
              normalization (lowercase, no punctuation or articles)
  F1 to full  token F1 of that line against full prefill's line
  retention   of the questions full prefill answers right (F1 >= 0.5
              against some gold alias), the share the mode still answers
              right
  F1, EM      against the gold aliases
  top-1, KL   of the first generated token's distribution, against full's
  TTFT        cb-run's ttft_ms; speedup = full's mean / the mode's mean

Every figure has a paired bootstrap 95% interval (the questions resampled,
the same draws for every mode), and so do the differences the table's
verdicts rest on: the default against reuse and against a random selection
of the same number of tokens (both controls run every time, with
closed-book: the question without passages).

Sets (--set): nq20 (../shared/data/nq20_dev.json: 600 NQ-open questions, the
gold passage among 20; questions 0-299 are the development half, --split
dev, 300-599 the test half, --split test: tune on dev, report test at a
recorded commit); nq20-near (the same questions and halves, each gold
passage kept where it is and the 19 others replaced by the 19 passages of
the set most similar to the question, by BM25 over words: distractors a
retriever would bring, for methods that rely on similar chunks); musique
(../shared/data/musique_s.json, the first 6
passages of ~550 tokens each, only the questions whose gold answer appears
in them: a multi-hop check).  No shape is built from the gold answer.

Cached per model under --cache (default ~/.cache/cacheblend/eval): the
passages' store; full prefill's and closed-book's answers and first-token
logits, keyed by the engine (a hash of full prefill's logits on a fixed
probe prompt: any change to the arithmetic invalidates them, a change to the
blend does not); each blend mode's results, keyed by the default blend's and
reuse's logits on the probe (--fresh: and the cb-run binary) and the mode's
options, so an interrupted run resumes and a method's run costs only its
own blends.  Full prefill's TTFT is timed once, when it is cached.

  python3 tests/bench/eval.py --set nq20 --split dev -n 300 --model M.gguf
  python3 tests/bench/eval.py --report-from results.json   (tables again)
"""
import argparse
import array
import hashlib
import json
import math
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter

SYSTEM = ("Answer the question using the passages. Reply with only the answer: "
          "a few words, no sentence, no explanation.")
DIAL = [1.5, 2, 3, 4, 6]  # --speedup values of the quality dial (4: cb-run's default)


# ------------------------------------------------------------------ metrics

def normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1(pred, gold):
    p, g = normalize(pred).split(), normalize(gold).split()
    if not p or not g:
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def first_line(ans):
    ans = ans.strip()
    return ans.split("\n")[0].strip() if ans else ""


def read_logits(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def kl_top1(p_logits, q_logits):
    """KL(softmax p || softmax q) and whether the argmaxes agree."""
    mp, mq = max(p_logits), max(q_logits)
    lzp = mp + math.log(math.fsum(math.exp(x - mp) for x in p_logits))
    lzq = mq + math.log(math.fsum(math.exp(x - mq) for x in q_logits))
    kl = math.fsum(math.exp(a - lzp) * ((a - lzp) - (b - lzq)) for a, b in zip(p_logits, q_logits))
    ap = max(range(len(p_logits)), key=p_logits.__getitem__)
    aq = max(range(len(q_logits)), key=q_logits.__getitem__)
    return max(kl, 0.0), ap == aq


def score(res, q, full):
    """A mode's result res for question q, scored (against full's result)."""
    pred = first_line(res["answer"])
    res["pred"] = pred
    res["f1"] = max(f1(pred, g) for g in q["answers"])
    res["em"] = max(float(normalize(pred) == normalize(g)) for g in q["answers"])
    res["right"] = res["f1"] >= 0.5
    if full is not None:
        res["agree"] = normalize(pred) == normalize(full["pred"])
        res["f1_full"] = f1(pred, full["pred"])
    return res


# ---------------------------------------------------------------- bootstrap

def draws(n, b, seed=0):
    """b resamples (with replacement) of n questions' indices: the same for
    every mode, so differences are paired."""
    rng = random.Random(seed)
    return [[rng.randrange(n) for _ in range(n)] for _ in range(b)]


def interval(xs):
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return (float("nan"), float("nan"))
    lo, hi = xs[int(0.025 * (len(xs) - 1))], xs[int(math.ceil(0.975 * (len(xs) - 1)))]
    return (lo, hi)


def mean(xs):
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def retention(mode, full, idx):
    """Of the questions in idx full answers right, the share mode does."""
    k = [i for i in idx if full[i]]
    return sum(mode[i] for i in k) / len(k) if k else float("nan")


def stat_fns():
    """metric name -> f(per-question columns of a mode, full's columns, idx)."""
    def avg(col):
        return lambda m, f, idx: sum(m[col][i] for i in idx) / len(idx)
    return {
        "agreement": avg("agree"),
        "f1_full": avg("f1_full"),
        "retention": lambda m, f, idx: retention(m["right"], f["right"], idx),
        "f1": avg("f1"),
        "em": avg("em"),
        "top1": avg("top1"),
        "kl": avg("kl"),
        "ttft_ms": avg("ttft_ms"),
        "speedup": lambda m, f, idx: (sum(f["ttft_ms"][i] for i in idx) / max(1e-9, sum(m["ttft_ms"][i] for i in idx))),
        "recomputed": lambda m, f, idx: (sum(m["n_recomputed_tokens"][i] for i in idx)
                                         / max(1, sum(m["n_cached_tokens"][i] for i in idx))),
    }


def columns(rows):
    keys = ["agree", "f1_full", "right", "f1", "em", "top1", "kl", "ttft_ms", "n_recomputed_tokens",
            "n_cached_tokens"]
    return {k: [float(r.get(k, float("nan"))) for r in rows] for k in keys}


def summarize(modes, order, b=1000, seed=0):
    """modes: name -> rows, each mode's rows for the same questions in the
    same order (full's among them).  Returns name -> {metric: (value, lo,
    hi)} and the paired differences the verdicts need."""
    fns = stat_fns()
    cols = {m: columns(modes[m]) for m in order}
    full = cols["full"]
    n = len(modes["full"])
    idx_all = list(range(n))
    ds = draws(n, b, seed)
    out = {}
    boot = {}
    for m in order:
        out[m], boot[m] = {}, {}
        for k, fn in fns.items():
            v = fn(cols[m], full, idx_all)
            bs = [fn(cols[m], full, d) for d in ds]
            boot[m][k] = bs
            out[m][k] = (v,) + interval(bs)
    diffs = {}
    pairs = [("default", "reuse"), ("default", "random"), ("default", "full")]
    pairs += [(m, "default") for m in order if m.startswith(("kv=", "nb=", "ar=", "al=", "method:"))]
    for a, c in pairs:
        if a in boot and c in boot:
            for k in ("agreement", "retention", "f1", "kl"):
                v = out[a][k][0] - out[c][k][0]
                diffs[(a, c, k)] = (v,) + interval([x - y for x, y in zip(boot[a][k], boot[c][k])])
    return out, diffs


# ---------------------------------------------------------------- the data

def load_set(name, path):
    data = json.load(open(path, encoding="utf-8"))
    data = data if isinstance(data, list) else [data]
    return near_distractors(data) if name == "nq20-near" else data


def words(text):
    return re.findall(r"\w+", text.lower())


def near_distractors(data):
    """nq20-near: each question's gold passage where it was, the other places filled, most
    similar first, by the set's passages (every question's, the gold one's text excluded) that
    score highest by BM25 (k1 1.2, b 0.75) with the question as the query.  Deterministic: ties
    go to the passage seen first."""
    pool, seen = [], set()
    for q in data:
        for c in q["ctxs"]:
            key = (c.get("title", ""), c["text"])
            if key not in seen:
                seen.add(key)
                pool.append(c)
    docs = [Counter(words(f"{c.get('title', '')} {c['text']}")) for c in pool]
    lens = [sum(d.values()) for d in docs]
    avg = sum(lens) / len(lens)
    df = Counter(w for d in docs for w in d)
    idf = {w: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for w, n in df.items()}
    out = []
    for q in data:
        g = q["gold"][0] if isinstance(q["gold"], list) else q["gold"]  # a list of one index
        gold = q["ctxs"][g]
        gkey = (gold.get("title", ""), gold["text"])
        terms = set(words(q["question"]))
        scored = []
        for i, (c, d, ln) in enumerate(zip(pool, docs, lens)):
            if (c.get("title", ""), c["text"]) == gkey:
                continue
            sc = sum(idf[w] * d[w] * 2.2 / (d[w] + 1.2 * (0.25 + 0.75 * ln / avg)) for w in terms if w in d)
            scored.append((-sc, i))
        scored.sort()
        near = [pool[i] for _, i in scored[:len(q["ctxs"]) - 1]]
        ctxs = near[:g] + [gold] + near[g:]
        out.append(dict(q, ctxs=ctxs))
    return out


def passages(q, set_name):
    n = 6 if set_name == "musique" else len(q["ctxs"])
    return [f"{c.get('title', '')}\n{c['text']}".strip() for c in q["ctxs"][:n]]


def gold_in_passages(q):
    text = normalize(" ".join(passages(q, "musique")))
    return any(normalize(a) and normalize(a) in text for a in q["answers"])


def question_text(q):
    return f"Answer the question with a few words, based on the passages above.\nQuestion: {q['question']}"


def select(args, data):
    """(number in the set, question) of the questions to run."""
    qs = list(enumerate(data))
    if args.set in ("nq20", "nq20-near"):
        half = {"dev": (0, 300), "test": (300, 600), "all": (0, len(qs))}[args.split]
        qs = qs[half[0]:half[1]]
    else:
        qs = [(i, q) for i, q in qs if gold_in_passages(q)]
        if args.split != "all":
            h = len(qs) // 2
            qs = qs[:h] if args.split == "dev" else qs[h:]
    return qs[args.first: args.first + args.questions]


# ----------------------------------------------------------------- running

def sha(path_or_bytes, n=16):
    h = hashlib.sha256()
    if isinstance(path_or_bytes, bytes):
        h.update(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            for blk in iter(lambda: f.read(1 << 20), b""):
                h.update(blk)
    return h.hexdigest()[:n]


class Runner:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.run = os.path.join(args.bin, "cb-run")
        self.pre = os.path.join(args.bin, "cb-precompute")
        self.common = ["-t", str(args.threads)] + (["-m", args.model] if args.model else [])

    def cb_run(self, extra, prompt, tag):
        stats = os.path.join(self.work, f"{tag}.stats.json")
        logits = os.path.join(self.work, f"{tag}.f32")
        cmd = ([self.run, "--temp", "0", "-n", str(self.args.max_new), "--system", SYSTEM, "--no-store-write",
                "--stats", stats, "--logits-out", logits, "-p", prompt] + self.common + extra)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            sys.exit(f"eval: {' '.join(cmd[:3])} ... exited {p.returncode}: {p.stderr.decode(errors='replace')[-500:]}")
        st = json.load(open(stats))
        return p.stdout.decode("utf-8", "replace"), st, logits

    def precompute(self, store, qs, kv_type="f16"):
        allf = os.path.join(self.work, "all.jsonl")
        with open(allf, "w", encoding="utf-8") as f:
            for qi, q in qs:
                for ci, t in enumerate(passages(q, self.args.set)):
                    f.write(json.dumps({"doc": f"q{qi}p{ci}", "seq": 0, "text": t}, ensure_ascii=False) + "\n")
        t0 = time.time()
        if not os.path.isdir(store):
            subprocess.run([os.path.join(self.args.bin, "cb-store"), "--store", store, "init"], check=True,
                           stdout=subprocess.DEVNULL)
        subprocess.run([self.pre, "--store", store, "-q", "--for-system", SYSTEM, "--kv-type", kv_type] +
                       self.common + [allf],
                       stdout=subprocess.DEVNULL, check=True)
        return time.time() - t0


def chunks_file(work, q, set_name, qi, kvs=None):
    """The question's passages as chunk records (kvs: each text's "kv", cb-precompute --neighbours')."""
    path = os.path.join(work, f"q{qi}{'-nb' if kvs else ''}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for t in passages(q, set_name):
            r = {"text": t, "kv": kvs[t]} if kvs and t in kvs else {"text": t}
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


# the passage cb-precompute --middle computes chunks after (lib/prompt/prompt.c's middle_text)
LEAD = ("Lighthouse\nA lighthouse is a tower that carries a bright lamp at its top to guide ships at night and in "
        "poor weather. Most stand on headlands, islands or harbour walls, where they mark dangerous rocks, shallow "
        "water and the safe way into a port. Each light flashes in its own pattern, so that sailors can tell one "
        "from another. Since the twentieth century many have been automated, and radio and satellite navigation "
        "now do much of the work they once did.")


def random_after_keys(rn, store, cache, qs, lead=None):
    """The control for --neighbours 1: each distinct passage computed after one other passage of
    the corpus drawn at random (seeded), or after the one text lead, through cb-precompute
    --context (the pair written as a document's two chunks); its text to that cache's key (named
    by -vv)."""
    allq = sorted(set(qi for qi, _ in qs))
    tag = f"al1-{sha(lead.encode())}" if lead else "ar1"
    path = os.path.join(cache, f"{tag}-{sha(json.dumps(allq).encode())}.json")
    if os.path.exists(path):
        return json.load(open(path))
    texts = sorted(set(t for _, q in qs for t in passages(q, rn.args.set)))
    rng = random.Random(1)
    allf = os.path.join(rn.work, "pairs.jsonl")
    with open(allf, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            j = rng.randrange(len(texts) - 1)
            r = lead or texts[j + (j >= i)]
            f.write(json.dumps({"doc": i, "seq": 0, "text": r}, ensure_ascii=False) + "\n")
            f.write(json.dumps({"doc": i, "seq": 1, "text": t}, ensure_ascii=False) + "\n")
    t0 = time.time()
    print(f"eval: each of {len(texts)} passages after {'the lead' if lead else 'a random other one'}",
          file=sys.stderr)
    p = subprocess.run([rn.pre, "--store", store, "-vv", "--for-system", SYSTEM, "--context"] + rn.common + [allf],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    after = {}  # the pair's line number (its second record) to the key
    for line in p.stderr.decode("utf-8", "replace").splitlines():
        m = re.match(r"cb-precompute: .*:(\d+): after the chunk before it, (?:stored|cached) (\S+)$", line)
        if m:
            after[int(m.group(1))] = m.group(2)
    kvs = {t: after[2 * i + 2] for i, t in enumerate(texts) if 2 * i + 2 in after}
    json.dump(kvs, open(path, "w"))
    print(f"eval: {len(kvs)} caches after {'the lead' if lead else 'a random passage'} in {time.time() - t0:.0f} s",
          file=sys.stderr)
    return kvs


def neighbour_keys(rn, store, cache, qs, k):
    """cb-precompute --neighbours k over the passages of every question selected (one corpus, as
    a user's would be): each passage's text to the key of its cache after its neighbours.  Kept in
    the cache per selection; the store skips what it holds."""
    allq = sorted(set(qi for qi, _ in qs))
    path = os.path.join(cache, f"nb{k}-{sha(json.dumps(allq).encode())}.json")
    if os.path.exists(path):
        return json.load(open(path))
    allf = os.path.join(rn.work, "corpus.jsonl")
    with open(allf, "w", encoding="utf-8") as f:
        for qi, q in qs:
            for ci, t in enumerate(passages(q, rn.args.set)):
                f.write(json.dumps({"doc": f"q{qi}p{ci}", "text": t}, ensure_ascii=False) + "\n")
    t0 = time.time()
    print(f"eval: cb-precompute --neighbours {k} over {len(qs)} questions' passages", file=sys.stderr)
    p = subprocess.run([rn.pre, "--store", store, "-q", "--for-system", SYSTEM, "--neighbours", str(k)] +
                       rn.common + [allf], stdout=subprocess.PIPE, check=True)
    kvs = {}
    for line in p.stdout.decode("utf-8").splitlines():
        r = json.loads(line)
        kvs[r["text"]] = r["kv"]
    json.dump(kvs, open(path, "w"))
    print(f"eval: neighbours' caches in {time.time() - t0:.0f} s", file=sys.stderr)
    return kvs


def kv_store(store, t):
    """The store of the passages' KV files of element type t (f16: the eval's own)."""
    return store if t == "f16" else f"{store}-{t}"


def mode_args(name, store, chunks, default_row):
    """cb-run's options for a mode; None: not run for this question."""
    blend = ["--store", store, "--chunks", chunks]
    if name == "full":
        return blend + ["--mode", "full"]
    if name == "closed":
        return ["--mode", "full"]
    if name == "reuse":
        return blend + ["--mode", "reuse"]
    if name == "default":
        return blend + ["--mode", "blend"]
    if name == "random":  # as many cached tokens as the default recomputed, drawn at random
        k, n = default_row["n_recomputed_tokens"], default_row["n_cached_tokens"]
        r = 0.0 if k == 0 else (k - 0.5) / n
        return blend + ["--mode", "blend", "--strategy", "random", "--speedup", "0", "--ratio", f"{r:.9f}"]
    if name.startswith("speedup="):
        return blend + ["--mode", "blend", "--speedup", name.split("=", 1)[1]]
    if name.startswith("kv="):  # the default blend from KV files of another element type
        return ["--store", kv_store(store, name[3:]), "--chunks", chunks, "--mode", "blend"]
    if name.startswith("method:"):  # method:LABEL:cb-run options
        return blend + ["--mode", "blend"] + name.split(":", 2)[2].split()
    sys.exit(f"eval: unknown mode '{name}'")


def run_eval(args):
    data_path = args.data or os.path.join(args.top, "..", "shared", "data",
                                          "musique_s.json" if args.set == "musique" else "nq20_dev.json")
    if not os.path.exists(data_path):
        sys.exit(f"eval: {data_path}: no such file (give --data)")
    data = load_set(args.set, data_path)
    qs = select(args, data)
    if not qs:
        sys.exit("eval: no question selected")
    model = args.model or os.environ.get("CB_MODEL") or ""
    mkey = os.path.basename(model) or "default-model"
    cache = os.path.join(os.path.expanduser(args.cache), mkey, args.set)
    os.makedirs(cache, exist_ok=True)
    store = os.path.join(cache, "store")
    work = tempfile.mkdtemp(prefix="cb-eval-")
    rn = Runner(args, work)
    try:
        if not os.path.isdir(store):
            subprocess.run([os.path.join(args.bin, "cb-store"), "--store", store, "init"], check=True,
                           stdout=subprocess.DEVNULL)
        pre_s = 0.0

        # the engine's key: full prefill's logits on the probe (the set's first question)
        q0 = data[0]
        pre_s += rn.precompute(store, [(0, q0)])
        _, _, lf = rn.cb_run(mode_args("full", store, chunks_file(work, q0, args.set, 0), None),
                             question_text(q0), "probe")
        engine = sha(open(lf, "rb").read() + args.set.encode() + str(args.max_new).encode() + SYSTEM.encode())
        full_dir = os.path.join(cache, "full-" + engine)
        os.makedirs(full_dir, exist_ok=True)
        # the blends' key: the default's and reuse's logits on the probe, so a
        # rebuild that leaves the blend's bits alone keeps its results (--fresh:
        # the binary's hash too, for a change on a method's own path)
        probe_chunks = chunks_file(work, q0, args.set, 0)
        blend_bits = b""
        for m in ("default", "reuse"):
            _, _, lf = rn.cb_run(mode_args(m, store, probe_chunks, None), question_text(q0), "probe")
            blend_bits += open(lf, "rb").read()
        binkey = sha(blend_bits + engine.encode()) + (("-" + sha(rn.run)) if args.fresh else "")
        blend_dir = os.path.join(cache, "runs-" + binkey)
        os.makedirs(blend_dir, exist_ok=True)
        # a stored type's results are keyed by its default blend's logits on the probe too
        kvkey = {}
        for t in args.kv_types:
            pre_s += rn.precompute(kv_store(store, t), [(0, q0)], t)
            _, _, lf = rn.cb_run(mode_args("kv=" + t, store, probe_chunks, None), question_text(q0), "probe")
            kvkey["kv=" + t] = sha(open(lf, "rb").read())
        print(f"eval: engine {engine}, blends {binkey}; cache {cache}", file=sys.stderr)

        modes = ["full", "closed", "reuse", "default", "random"]
        modes += [f"speedup={s:g}" for s in args.dial if s != 4]
        modes += [m for m in args.methods if m]
        modes += ["kv=" + t for t in args.kv_types]
        nb_kvs = {}
        if args.neighbours or args.after_random or args.after_lead:  # the selected questions' passages and the probe's
            nb_qs = ([] if any(qi == 0 for qi, _ in qs) else [(0, q0)]) + qs
            nb_kvs = (random_after_keys(rn, store, cache, nb_qs) if args.after_random else
                      random_after_keys(rn, store, cache, nb_qs, args.lead) if args.after_lead else
                      neighbour_keys(rn, store, cache, nb_qs, args.neighbours))
            m = "ar=1" if args.after_random else "al=1" if args.after_lead else f"nb={args.neighbours}"
            _, _, lf = rn.cb_run(mode_args("default", store, chunks_file(work, q0, args.set, 0, nb_kvs), None),
                                 question_text(q0), "probe")
            kvkey[m] = sha(open(lf, "rb").read())
            modes.append(m)

        def cache_file(m):
            d = full_dir if m in ("full", "closed") else blend_dir
            return os.path.join(d, hashlib.sha256((m + kvkey.get(m, "")).encode()).hexdigest()[:12] + ".jsonl")

        done = {}
        for m in modes:
            done[m] = {}
            cf = cache_file(m)
            if os.path.exists(cf):
                for line in open(cf, encoding="utf-8"):
                    if line.strip():
                        r = json.loads(line)
                        done[m][r["q"]] = r
        t_start = time.time()
        for n_done, (qi, q) in enumerate(qs):
            chunks = chunks_file(work, q, args.set, qi)
            prompt = question_text(q)
            if any(qi not in done[m] for m in modes if m != "closed"):  # its passages, as it comes
                pre_s += rn.precompute(store, [(qi, q)])
            for t in args.kv_types:
                if qi not in done["kv=" + t]:
                    pre_s += rn.precompute(kv_store(store, t), [(qi, q)], t)
            rows = {}
            for m in modes:
                if qi in done[m]:
                    rows[m] = done[m][qi]
                    continue
                extra = (mode_args("default", store, chunks_file(work, q, args.set, qi, nb_kvs), None)
                         if m.startswith(("nb=", "ar=", "al=")) else mode_args(m, store, chunks, rows.get("default")))
                ans, st, lf = rn.cb_run(extra, prompt, "run")
                r = {"q": qi, "mode": m, "answer": ans, "ttft_ms": st["ttft_ms"],
                     "n_prompt_tokens": st["n_prompt_tokens"], "n_cached_tokens": st.get("n_cached_tokens", 0),
                     "n_recomputed_tokens": st.get("n_recomputed_tokens", 0),
                     "strategy_used": st.get("strategy_used"), "ratio": st.get("ratio")}
                if m in ("full", "closed"):
                    shutil.copyfile(lf, os.path.join(full_dir, f"{m}-{qi}.f32"))
                    r["kl"], r["top1"] = (0.0, True) if m == "full" else kl_top1(
                        read_logits(os.path.join(full_dir, f"full-{qi}.f32")), read_logits(lf))
                else:
                    r["kl"], r["top1"] = kl_top1(read_logits(os.path.join(full_dir, f"full-{qi}.f32")),
                                                 read_logits(lf))
                with open(cache_file(m), "a", encoding="utf-8") as f:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
                done[m][qi] = rows[m] = r
            el = time.time() - t_start
            print(f"eval: question {qi} ({n_done + 1} of {len(qs)}, {el:.0f} s)", file=sys.stderr)
        results = [done[m][qi] for qi, _ in qs for m in modes]
        meta = {"set": args.set, "split": args.split, "first": args.first, "n": len(qs),
                "model": mkey, "engine": engine, "blends": binkey, "commit": git_commit(args.top),
                "threads": args.threads, "max_new": args.max_new, "system": SYSTEM, "modes": modes,
                "precompute_s": pre_s}
        out = {"meta": meta, "results": results, "questions": {str(qi): {"answers": q["answers"]} for qi, q in qs}}
        json.dump(out, open(args.out, "w"), indent=1)
        print(f"eval: results in {args.out}", file=sys.stderr)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def git_commit(top):
    try:
        c = subprocess.run(["git", "-C", top, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return c + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


# ------------------------------------------------------------------ report

def pct(v):
    return f"{100 * v:.1f}" if v == v else "n/a"


def fmt(t, p=True, digits=3):
    v, lo, hi = t
    if p:
        return f"{pct(v)} [{pct(lo)}, {pct(hi)}]"
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def label(m):
    return {"full": "full prefill", "closed": "closed-book (control)", "reuse": "reuse (control)",
            "random": "random selection, default's budget (control)",
            "default": "**blend, default (speedup 4)**"}.get(
        m, m.replace("speedup=", "blend, speedup ").replace("kv=", "blend, default, from KV files of type ")
        .replace("nb=", "blend, default, chunks computed after neighbours: ")
        .replace("ar=1", "blend, default, chunks computed after a random passage (control)")
        .replace("al=1", "blend, default, chunks computed after one fixed lead passage"))


def report(out, b=1000, plot=None, q_from=0):
    meta, questions = out["meta"], out["questions"]
    order = [m for m in meta["modes"]]
    modes = {m: sorted([dict(r) for r in out["results"] if r["mode"] == m and r["q"] >= q_from],
                       key=lambda r: r["q"]) for m in order}
    fulls = {}
    for r in modes["full"]:
        fulls[r["q"]] = score(r, questions[str(r["q"])], None)
        r["agree"], r["f1_full"] = True, 1.0
    for m in order[1:]:
        for r in modes[m]:
            score(r, questions[str(r["q"])], fulls.get(r["q"]))
    qn = [r["q"] for r in modes["full"]]
    for m in order:
        if [r["q"] for r in modes[m]] != qn:
            sys.exit(f"eval: mode {m} lacks some questions")
    summ, diffs = summarize(modes, order, b)
    n_right = sum(1 for r in modes["full"] if r["right"])
    lines = []
    w = lines.append
    w(f"{meta['set']} {meta['split']} half, questions {qn[0]}-{qn[-1]} ({len(qn)}); model {meta['model']}; "
      f"commit {meta['commit']}; {meta['threads']} threads; greedy, {meta['max_new']} new tokens; "
      f"full prefill answers {n_right} right (F1 >= 0.5). 95% paired bootstrap intervals ({b} draws).")
    w("")
    w("| mode | agreement % | retention % | F1 to full | F1 (gold) | EM (gold) | first-token top-1 % | KL | "
      "recomputed % | TTFT ms | speedup |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in order:
        s = summ[m]
        w(f"| {label(m)} | {fmt(s['agreement'])} | {fmt(s['retention'])} | {fmt(s['f1_full'], False)} | "
          f"{fmt(s['f1'], False)} | {s['em'][0]:.3f} | {pct(s['top1'][0])} | {s['kl'][0]:.3f} | "
          f"{pct(s['recomputed'][0])} | {s['ttft_ms'][0]:.0f} | {fmt(s['speedup'], False, 2)}x |")
    w("")
    for c in ("reuse", "random"):
        for k in ("agreement", "retention"):
            d = diffs.get(("default", c, k))
            if d:
                verdict = "above" if d[1] > 0 else "NOT above"
                w(f"- default minus {c}, {k}: {100 * d[0]:+.1f} points [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]: "
                  f"the default is {verdict} {c} outside the interval")
    for m in order:
        for k in ("agreement", "retention"):
            d = diffs.get((m, "default", k)) if m.startswith(("kv=", "nb=", "ar=", "al=", "method:")) else None
            if d and m.startswith("kv="):
                w(f"- {m[3:]} files minus f16 files, the default blend's {k}: {100 * d[0]:+.1f} points "
                  f"[{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]")
            elif d:
                w(f"- {label(m)} minus the default, {k}: {100 * d[0]:+.1f} points "
                  f"[{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]")
    d = diffs.get(("default", "full", "f1"))
    if d:
        w(f"- default minus full prefill, F1 against gold: {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]")
    text = "\n".join(lines)
    if plot:
        dial_plot(summ, order, dict(meta, n=len(qn)), plot)
    return text, summ


def dial_plot(summ, order, meta, png):
    if not shutil.which("gnuplot"):
        print("eval: no gnuplot: no plot", file=sys.stderr)
        return
    work = tempfile.mkdtemp(prefix="cb-eval-plot-")
    try:
        dat = os.path.join(work, "dial.dat")
        dial = [m for m in order if m == "default" or m.startswith("speedup=")]
        dial.sort(key=lambda m: summ[m]["speedup"][0])
        with open(dat, "w") as f:
            for m in dial:
                s = summ[m]
                lab = "4" if m == "default" else m.split("=", 1)[1]
                f.write(f"{s['speedup'][0]:.3f} {100 * s['agreement'][0]:.2f} {100 * s['agreement'][1]:.2f} "
                        f"{100 * s['agreement'][2]:.2f} {100 * s['retention'][0]:.2f} {100 * s['retention'][1]:.2f} "
                        f"{100 * s['retention'][2]:.2f} \"{lab}\"\n")
            f.write("\n\n")
            for m in ("reuse", "random"):
                if m in summ:
                    s = summ[m]
                    f.write(f"{s['speedup'][0]:.3f} {100 * s['agreement'][0]:.2f} {100 * s['agreement'][1]:.2f} "
                            f"{100 * s['agreement'][2]:.2f} {100 * s['retention'][0]:.2f} "
                            f"{100 * s['retention'][1]:.2f} {100 * s['retention'][2]:.2f} \"{m}\"\n")
        title = f"{meta['model']}, {meta['set']} {meta['split']} ({meta['n']} questions)"
        script = (f"set terminal png noenhanced size 1000,600; set output '{png}'; set grid; set key bottom left;"
                  f"set title \"{title}\\nthe quality dial (labels: --speedup; bars: 95% intervals)\";"
                  "set xlabel 'TTFT speedup over full prefill (x)'; set ylabel '%'; set yrange [0:105];"
                  f"plot '{dat}' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title 'agreement with full',"
                  f" '' index 0 using 1:5:6:7 with yerrorlines lw 2 pt 5 title 'retention',"
                  f" '' index 0 using 1:2:8 with labels offset 0,1 notitle,"
                  f" '' index 1 using 1:2:3:4 with yerrorbars pt 9 ps 1.5 title 'controls: agreement',"
                  f" '' index 1 using 1:5:6:7 with yerrorbars pt 11 ps 1.5 title 'controls: retention',"
                  f" '' index 1 using 1:2:8 with labels offset 0,-1 notitle")
        subprocess.run(["gnuplot", "-e", script], check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=["nq20", "nq20-near", "musique"], default="nq20")
    ap.add_argument("--split", choices=["dev", "test", "all"], default="dev",
                    help="nq20, nq20-near: dev = questions 0-299 (tune here), test = 300-599 (report); "
                         "musique: halves")
    ap.add_argument("--data", default=None, help="the set's file (default: ../shared/data/)")
    ap.add_argument("-n", "--questions", type=int, default=300)
    ap.add_argument("--first", type=int, default=0, help="skip the split's first N questions")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bin", default=os.path.join(top, "bin"))
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--dial", default=",".join(f"{s:g}" for s in DIAL),
                    help="--speedup values of the quality dial, comma-separated ('' for none)")
    ap.add_argument("--method", action="append", default=[], dest="methods",
                    help="a method to compare, as method:LABEL:cb-run options (repeatable)")
    ap.add_argument("--kv-type", default="", dest="kv_types",
                    help="also the default blend from KV files of these element types (comma-separated, "
                         "cb-precompute --kv-type), each against the same blend from f16 files")
    ap.add_argument("--neighbours", type=int, default=0,
                    help="also the default blend with each passage's cache computed after its K most similar "
                         "passages of the questions selected (cb-precompute --neighbours K)")
    ap.add_argument("--after-random", action="store_true",
                    help="instead: each passage computed after one other passage drawn at random, the "
                         "control for --neighbours 1")
    ap.add_argument("--after-lead", action="store_true",
                    help="instead: each passage computed after one fixed lead passage (--lead)")
    ap.add_argument("--lead", default=LEAD, help="that passage (default: eval.py's LEAD)")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache",
                                                    "cacheblend", "eval"))
    ap.add_argument("--out", default="eval-results.json")
    ap.add_argument("--report", default=None, help="also write the table (markdown) to this file")
    ap.add_argument("--plot", default="eval-dial.png", help="the quality dial's plot ('' for none)")
    ap.add_argument("--fresh", action="store_true",
                    help="key the blends' cached results by the cb-run binary too (a change to a method's own "
                         "path that leaves the default's bits alone)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--report-from", default=None, help="the table of an earlier results file")
    ap.add_argument("--questions-from", type=int, default=0,
                    help="with --report-from: only the questions numbered from Q on (say, those whose "
                         "runs were all timed on a quiet machine)")
    args = ap.parse_args()
    args.top = top
    args.kv_types = [t for t in args.kv_types.split(",") if t.strip() and t != "f16"]
    args.dial = [float(x) for x in args.dial.split(",") if x.strip()] if isinstance(args.dial, str) else args.dial
    out = json.load(open(args.report_from)) if args.report_from else run_eval(args)
    text, _ = report(out, args.bootstrap, args.plot or None, args.questions_from)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
