#!/bin/sh
# make eval's report (tests/bench/eval.py --report-from) on a results file
# written here, no model run: agreement with full prefill, retention,
# F1 to full's answer, gold F1 and EM, speedup, the paired bootstrap
# intervals, and the verdicts against the controls (reuse, random).
. "$(dirname "$0")/lib.sh"
EVAL=$(dirname "$0")/../bench/eval.py

# 40 questions.  full answers the first 20 right (its answer "paris"),
# the rest wrong ("rome" against gold "oslo").  default agrees with full on
# 36 (wrong on q 0-3 where full was right: "nice"); reuse and random agree on
# 10 (q 30-39) only; closed-book never.  TTFTs: full 4000, default 1000,
# random 900, reuse 400, closed 100.
python3 - "$T/res.json" <<'PY'
import json, sys
res = []
for q in range(40):
    gold = "paris" if q < 20 else "oslo"
    full = "Paris" if q < 20 else "Rome"
    res.append({"q": q, "mode": "full", "answer": full, "ttft_ms": 4000, "kl": 0.0, "top1": True,
                "n_cached_tokens": 0, "n_recomputed_tokens": 0, "gold": gold})
    for m, ttft, agree, rec in (("closed", 100, lambda q: False, 0), ("reuse", 400, lambda q: q >= 30, 0),
                                ("default", 1000, lambda q: q >= 4, 20), ("random", 900, lambda q: q >= 30, 20)):
        res.append({"q": q, "mode": m, "answer": full if agree(q) else "the Nice.\nmore", "ttft_ms": ttft,
                    "kl": 0.1 if agree(q) else 1.0, "top1": agree(q), "n_cached_tokens": 100,
                    "n_recomputed_tokens": rec, "gold": gold})
json.dump({"meta": {"set": "nq20", "split": "dev", "first": 0, "n": 40, "model": "m.gguf", "engine": "e",
                    "binary": "b", "commit": "c", "threads": 2, "max_new": 16, "system": "S",
                    "modes": ["full", "closed", "reuse", "default", "random"], "precompute_s": 0},
           "results": res, "questions": {str(q): {"answers": ["paris" if q < 20 else "oslo"]} for q in range(40)}},
          open(sys.argv[1], "w"))
PY
python3 "$EVAL" --report-from "$T/res.json" --plot "$T/p.png" --bootstrap 400 > "$T/table" 2>"$T/err"
rc=$?
[ "$rc" = 0 ] && ok "eval.py --report-from reads a results file" || { not_ok "eval.py --report-from (exit $rc)"; sed 's/^/#   /' "$T/err"; }
row() { grep -F "| $1 |" "$T/table"; }
# default: agreement 36/40 = 90.0; retention 16/20 = 80.0; gold F1 (16 + 0) / 40 = 0.400;
# EM 0.400; speedup 4000 / 1000 = 4.00; recomputed 20%
case $(row "**blend, default (speedup 4)**") in
*"| 90.0 ["*"| 80.0 ["*"| 0.400 ["*"| 0.400 | 90.0 |"*"| 20.0 | 1000 | 4.00 ["*) ok "the default's agreement, retention, gold F1 and EM, top-1, recomputed share and speedup" ;;
*) not_ok "the default's row: $(row "**blend, default (speedup 4)**")" ;;
esac
# reuse: agreement 10/40 = 25.0, retention 0/20 = 0.0, speedup 10.00
case $(row "reuse (control)") in
*"| 25.0 ["*"| 0.0 [0.0, 0.0] |"*"| 10.00 ["*) ok "reuse's agreement, retention and speedup" ;;
*) not_ok "reuse's row: $(row "reuse (control)")" ;;
esac
case $(row "full prefill") in
*"| 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] | 1.000 [1.000, 1.000] | 0.500 ["*) ok "full prefill agrees with itself; its gold F1 0.5" ;;
*) not_ok "full's row: $(row "full prefill")" ;;
esac
# every interval holds its value: lo <= v <= hi
python3 - "$T/table" <<'PY' && ok "every interval holds its value" || not_ok "an interval that misses its value"
import re, sys
bad = [m.group(0) for m in re.finditer(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", open(sys.argv[1]).read())
       if not float(m.group(2)) <= float(m.group(1)) <= float(m.group(3))]
sys.exit(1 if bad else 0)
PY
# verdicts: default - reuse agreement +65 points, far outside; retention +80
grep -q "default minus reuse, agreement: +65.0 points \[+[0-9.]*, +[0-9.]*\]: the default is above reuse" "$T/table" \
    && ok "the verdict against reuse: above, outside the interval" || { not_ok "the verdict against reuse"; sed 's/^/#   /' "$T/table" | tail -6; }
grep -q "default minus random, retention: +80.0 points" "$T/table" && ok "the difference from random selection" \
    || not_ok "the difference from random selection"
# a tie is not called a win: the default made equal to random
python3 - "$T/res.json" "$T/tie.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
byq = {r["q"]: r for r in d["results"] if r["mode"] == "default"}
for r in d["results"]:
    if r["mode"] == "random":
        r.update({k: byq[r["q"]][k] for k in ("answer", "kl", "top1")})
json.dump(d, open(sys.argv[2], "w"))
PY
python3 "$EVAL" --report-from "$T/tie.json" --plot '' --bootstrap 200 > "$T/tie" 2>&1
grep -q "default minus random, agreement: +0.0 points \[+0.0, +0.0\]: the default is NOT above random" "$T/tie" \
    && ok "a tie with random selection says NOT above" || { not_ok "the tie's verdict"; grep "random" "$T/tie" | sed 's/^/#   /'; }
if command -v gnuplot >/dev/null 2>&1; then
    [ -s "$T/p.png" ] && ! grep -q "line 0:" "$T/err" && ok "the dial plot is drawn (gnuplot said nothing wrong)" ||
        { not_ok "the dial plot"; sed 's/^/#   /' "$T/err" | head -5; }
else
    skip "the dial plot is drawn" "no gnuplot here"
fi
# nq20-near: the gold passage stays where it was; the others are the set's passages most similar
# to the question (here the one sharing its rare word "zephyr" first, then "harbour"), never the
# gold one again, the same on every load.
python3 - "$EVAL" "$T/near.json" <<'PY' && ok "nq20-near keeps the gold passage in place and ranks the set's passages by the question" || not_ok "nq20-near's distractors"
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("ev", sys.argv[1]); ev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ev)
P = lambda t, x: {"title": t, "text": x}
data = [{"question": "which zephyr reached the harbour", "answers": ["x"], "gold": [1],
         "ctxs": [P("a", "apples grow on trees"), P("g", "the gold passage of the first question"), P("b", "bread and butter")]},
        {"question": "what is bread", "answers": ["y"], "gold": [0],
         "ctxs": [P("z", "the zephyr blew over the harbour"), P("h", "a harbour for ships"), P("c", "cheese")]}]
json.dump(data, open(sys.argv[2], "w"))
a = ev.load_set("nq20-near", sys.argv[2]); b = ev.load_set("nq20-near", sys.argv[2])
q = a[0]["ctxs"]
assert a == b, "not deterministic"
assert q[1]["title"] == "g" and len(q) == 3, q
assert [c["title"] for c in q] == ["z", "g", "h"], [c["title"] for c in q]
assert a[1]["ctxs"][0]["title"] == "z" and a[1]["ctxs"][1]["title"] == "b", a[1]["ctxs"]
assert all(c["title"] != "z" for c in a[1]["ctxs"][1:]), "the gold passage came back as a distractor"
PY
done_testing
