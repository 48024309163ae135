#!/bin/sh
# make eval's report (tests/bench/eval.py --table-from) on a results file
# written here, no model run: F1 against full's with the paired standard
# error, answers identical to full, KL recovery against the reuse run (also
# when that run has options, as reuse/no-context), speedups; and the sweep
# plot's panels (F1, identity, KL recovery; the NLL one only when scored).
. "$(dirname "$0")/lib.sh"
EVAL=$(dirname "$0")/../bench/eval.py

# two questions: full, reuse/no-context, blend probe at 0.15 and 0.3, and the
# runs at cb-run's own ratio (mode default, and blend/no-context: a point of
# their own on the plot, not a line)
python3 - "$T/res.json" <<'PY'
import json, sys
def r(q, mode, ratio, strat, f1, kl, same, ttft):
    return {"q": q, "mode": mode, "ratio": ratio, "strategy": strat, "answer": "a", "f1": f1, "em": 0.0,
            "ttft_ms": ttft, "prefill_ms": ttft, "load_ms": 0, "n_prompt_tokens": 100, "n_cached_tokens": 80,
            "n_recomputed_tokens": int(80 * (ratio or 0)), "n_chunks": 4, "n_chunks_after": 0,
            "nll": float("nan"), "nll_tokens": 0, "nll_top1": float("nan"), "nll_gap": float("nan"),
            "nll_absgap": float("nan"), "kl": kl, "top1": kl < 0.5, "same": same}
res = [r(0, "full", None, None, 1.0, 0.0, True, 1000), r(1, "full", None, None, 0.5, 0.0, True, 3000),
       r(0, "reuse", None, "no-context", 0.5, 2.0, False, 100), r(1, "reuse", None, "no-context", 0.5, 1.0, False, 100),
       r(0, "blend", 0.15, "probe/no-context", 1.0, 1.0, True, 400), r(1, "blend", 0.15, "probe/no-context", 0.0, 0.5, False, 600),
       r(0, "blend", 0.3, "probe/no-context", 1.0, 0.5, True, 900), r(1, "blend", 0.3, "probe/no-context", 0.5, 0.0, True, 1100),
       r(0, "default", None, None, 1.0, 0.25, True, 700), r(1, "default", None, None, 0.5, 0.25, True, 700),
       r(0, "blend", None, "no-context", 1.0, 1.5, True, 300), r(1, "blend", None, "no-context", 0.5, 1.5, False, 300)]
json.dump({"args": {"passages": 6, "model": "m.gguf", "threads": 2, "kv_type": "f16", "shape": "many"},
           "results": res}, open(sys.argv[1], "w"))
PY
python3 "$EVAL" --table-from "$T/res.json" --plot "$T/p.png" > "$T/table" 2>"$T/err"
rc=$?
[ "$rc" = 0 ] && ok "eval.py --table-from reads a results file" || { not_ok "eval.py --table-from (exit $rc)"; sed 's/^/#   /' "$T/err"; }
row() { grep -F "| $1 |" "$T/table"; }
# blend 0.15: F1 (1, 0): 0.5 +- 0.5; minus full's (1, 0.5): differences (0, -0.5), -0.25 +-
# 0.25; kept 0.5 / 0.75; identical 50%; KL 0.75 against reuse's 1.5: 50% recovered; TTFT 500
# ms against full's 2000: 4.00x; minus reuse's (0.5, 0.5): differences (0.5, -0.5), 0 +- 0.5
r15=$(row "blend r=0.15 probe/no-context")
case $r15 in
*"| 0.500 +- 0.500 | -0.250 +- 0.250 | 67% | +0.000 +- 0.500 |"*"| 50% |"*"| 0.7500 | 50.0% |"*"| 500 | 4.00x |") ok "F1, its paired differences from full's and reuse's, identity, KL recovery against reuse/no-context, speedup" ;;
*) not_ok "the blend row: $r15" ;;
esac
r30=$(row "blend r=0.3 probe/no-context")
case $r30 in
*"| 100% |"*"| 0.2500 | 83.3% |"*"| 1000 | 2.00x |"*) ok "a second ratio, its own row" ;;
*) not_ok "the second blend row: $r30" ;;
esac
# default: F1 kept 100%, minus reuse's (0.5, 0): 0.25 +- 0.25, KL 0.25 (83.3% recovered), 2.86x
case $(row "default") in
*"| 100% | +0.250 +- 0.250 |"*"| 100% |"*"| 0.2500 | 83.3% |"*"| 700 | 2.86x |") ok "the default blend (cb-run's own ratio), its row" ;;
*) not_ok "default row: $(row "default")" ;;
esac
case $(row "blend no-context") in
*"| 50% |"*"| 1.5000 | 0.0% |"*"| 300 | 6.67x |") ok "a blend without a ratio (blend/no-context), its row" ;;
*) not_ok "blend/no-context row: $(row "blend no-context")" ;;
esac
case $(row "reuse no-context") in
*"| 1.5000 | 0.0% |"*) ok "reuse/no-context is recovery's reference (0%)" ;;
*) not_ok "reuse row: $(row "reuse no-context")" ;;
esac
if command -v gnuplot >/dev/null 2>&1; then
    [ -s "$T/p.png" ] && ! grep -q "line 0:" "$T/err" && ok "the sweep plot is drawn (gnuplot said nothing wrong)" ||
        { not_ok "the sweep plot"; sed 's/^/#   /' "$T/err" | head -5; }
    # three panels, 700 pixels each: F1, identity, KL (not scored: no NLL panel)
    w=$(python3 -c "import struct,sys; d=open(sys.argv[1],'rb').read(24); print(struct.unpack('>I', d[16:20])[0])" "$T/p.png")
    [ "$w" = 2100 ] && ok "three panels without scores (2100 pixels wide)" || not_ok "the plot is $w pixels wide, not 2100"
else
    skip "the sweep plot is drawn" "no gnuplot here"
    skip "three panels without scores" "no gnuplot here"
fi
done_testing
