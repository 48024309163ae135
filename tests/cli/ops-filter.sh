#!/bin/sh
# test_backend_ops' case filters, which the GPU script's sanitizer steps use
# to split a long run: $CB_OPS_ONLY runs only the cases whose name holds one
# of its '|'-separated parts, $CB_OPS_SKIP leaves those out, both together
# intersect; a case left out is a skipped line, not a missing one.  (The
# checks that are not op cases, such as matmul_multi's, always run.)
. "$(dirname "$0")/lib.sh"
OPS=${BUILD:-build/rel}/tests/test_backend_ops
if [ ! -x "$OPS" ]; then
    skip "test_backend_ops' filters" "no $OPS (make check-tools builds it)"
    done_testing
    exit
fi
"$OPS" > "$T/all" 2>&1 || not_ok "test_backend_ops alone"
total=$(grep -c '^ok\|^not ok' "$T/all")
# ran: the lines of cases that ran (ok, not a skip) whose name holds $1; left: skipped ones
ran() { grep '^ok' "$2" | grep -v '# SKIP' | grep -c -- "$1"; }
left() { grep '^ok' "$2" | grep '# SKIP left out by' | grep -c -- "$1"; }
CB_OPS_ONLY='rmsnorm|attn_mass' "$OPS" > "$T/only" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(ran rmsnorm "$T/only")" -gt 0 ] && [ "$(ran 'attn_mass f32' "$T/only")" -gt 0 ] &&
    [ "$(ran 'matmul f32 7x512x48' "$T/only")" -eq 0 ] && [ "$(left 'matmul f32 7x512x48' "$T/only")" -gt 0 ] &&
    [ "$(grep -c '^ok\|^not ok' "$T/only")" -eq "$total" ] &&
    ok "CB_OPS_ONLY: its cases run, the others are skipped lines ($total lines either way)" ||
    not_ok "CB_OPS_ONLY (rc $rc)"
CB_OPS_SKIP='attention|matmul f32' "$OPS" > "$T/skip" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(ran 'attention f' "$T/skip")" -eq 0 ] && [ "$(ran 'matmul f32' "$T/skip")" -eq 0 ] &&
    [ "$(left 'attention f' "$T/skip")" -gt 0 ] && [ "$(ran rmsnorm "$T/skip")" -gt 0 ] &&
    [ "$(ran attn_mass "$T/skip")" -gt 0 ] && [ "$(grep -c '^ok\|^not ok' "$T/skip")" -eq "$total" ] &&
    ok "CB_OPS_SKIP: its cases are skipped lines, the others run" || not_ok "CB_OPS_SKIP (rc $rc)"
CB_OPS_ONLY='attn_mass' CB_OPS_SKIP='f16' "$OPS" > "$T/both" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(ran 'attn_mass f32' "$T/both")" -gt 0 ] && [ "$(ran 'attn_mass f16' "$T/both")" -eq 0 ] &&
    [ "$(left 'attn_mass f16' "$T/both")" -gt 0 ] && [ "$(ran rmsnorm "$T/both")" -eq 0 ] &&
    ok "both: the cases in CB_OPS_ONLY and not in CB_OPS_SKIP" || not_ok "CB_OPS_ONLY with CB_OPS_SKIP (rc $rc)"
done_testing
