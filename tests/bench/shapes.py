#!/usr/bin/env python3
"""The MuSiQue prompt shapes of make diag (tests/bench/diag.py): the
passages as chunks in three shapes (paper: the passages; many: sentence-
aligned chunks of 100-150 tokens; short: ~50 tokens around the answer),
their precompute, and the question's wording.  The many and short shapes
use the gold answer to choose text, so they serve diagnostics only; make
eval (eval.py) builds no shape from the gold answer.
"""
import json
import os
import re
import subprocess
import time

from eval import normalize  # noqa: E402  (one normalization for both)


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
