#!/bin/sh
# A read-only store (issue 16): a store on a read-only file system, or one
# this user may not write, works for cb-run and cb-store ls/stat/get/verify:
# no lock file, no access recorded, missing chunks computed and not stored,
# said once; the commands that would change it fail with 73 and leave it as
# it was.  The read-only view is a read-only bind mount (as root) or a
# chmod'ed copy (as another user); the test skips where neither works.
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
S=$T/store RO=$T/ro
if [ ! -f "$M" ]; then
    skip "read-only store" "no $M (tests/run.sh makes it)"
    done_testing; exit 0
fi
mkdir -p "$T/docs"
for i in 1 2; do
    printf 'Document %s. The river Vale runs past the town of Kelby %s.\n\nIts bridge was built in 19%s0.\n' $i $i $i > "$T/docs/d$i.txt"
done
"$CHUNK" -m "$M" --tokens 24 "$T/docs" > "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
"$PRE" -m "$M" --store "$S" -q < "$T/chunks.jsonl" > /dev/null || { not_ok "cb-precompute"; done_testing; exit 1; }
printf '{"text": "A brand new chunk about the Kelby ferry, never precomputed."}\n' > "$T/new.jsonl"
cat "$T/chunks.jsonl" >> "$T/new.jsonl"
Q="Who built the bridge over the Vale?"
"$RUN" -m "$M" --chunks "$T/new.jsonl" --mode full --no-store-write -n 6 -p "$Q" > "$T/a-full" 2>/dev/null \
    || { not_ok "cb-run --mode full"; done_testing; exit 1; }

# The read-only view.
how=""
mkdir -p "$RO"
if [ "$(id -u)" -eq 0 ]; then
    if mount -o bind,ro "$S" "$RO" 2>/dev/null; then
        if touch "$RO/.w" 2>/dev/null; then rm -f "$RO/.w"; umount "$RO"; else how="a read-only bind mount"; fi
    fi
    [ -n "$how" ] && trap 'umount "$RO" 2>/dev/null; rm -rf "$T"' EXIT
else
    rmdir "$RO"; cp -a "$S" "$RO" && chmod -R a-w "$RO" && how="a directory without write permission"
    trap 'chmod -R u+w "$T" 2>/dev/null; rm -rf "$T"' EXIT
fi
if [ -z "$how" ]; then
    skip "read-only store" "neither a read-only bind mount nor a chmod'ed store can be set up here"
    done_testing; exit 0
fi
echo "# the read-only store is $how"
SR="$STORE --store $RO"
$STORE --store "$S" ls --json > "$T/before.json"
$STORE --store "$S" stat > "$T/before.stat"
rm -f "$S/lock"   # the read-only store must not need it
ls -lAR --time-style=full-iso "$S" > "$T/before.ls"

expect_exit "ls" 0 $SR ls
[ "$(wc -l < "$T/out")" -eq "$(wc -l < "$T/before.json")" ] && ok "ls lists every entry" || not_ok "ls lists every entry"
[ "$(grep -c 'read-only' "$T/err")" -eq 1 ] && ok "ls says once that the store is read-only" \
    || { not_ok "the read-only note"; sed 's/^/#   /' "$T/err"; }
expect_exit "stat" 0 $SR stat
K=$(head -n 1 "$T/before.json" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["key"])')
expect_exit "get" 0 $SR get "$K"
[ -f "$(cat "$T/out")" ] && ok "get prints the entry's path" || not_ok "get prints the entry's path"
expect_exit "get -o FILE" 0 $SR get "$K" -o "$T/copy.kv"
$SR get "$K" -o - 2>/dev/null | cmp -s - "$T/copy.kv" && ok "get -o - gives the same bytes" || not_ok "get -o -"
expect_exit "verify" 0 $SR verify
expect_exit "export" 0 $SR export "$T/all.tar"
[ "$(tar -tf "$T/all.tar" | wc -l)" -eq "$(wc -l < "$T/before.json")" ] && ok "export writes every entry" || not_ok "export from a read-only store"
expect_exit "import is refused" 73 $SR import "$T/all.tar"
expect_exit "put is refused" 73 $SR put "$T/copy.kv"
grep -q "read-only" "$T/err" && ok "put names the reason" || not_ok "put names the reason"
expect_exit "rm is refused" 73 $SR rm "$K"
expect_exit "pin is refused" 73 $SR pin "$K"
expect_exit "gc is refused" 73 $SR gc
expect_exit "verify --repair is refused" 73 $SR verify --repair

# cb-run: hits are not recorded, the missing chunk is computed and not stored.
"$RUN" -m "$M" --store "$RO" --chunks "$T/new.jsonl" -n 6 -p "$Q" --ratio 1 --stats "$T/n1.json" > "$T/a-ro" 2> "$T/err"; rc=$?
[ $rc -eq 0 ] && ok "cb-run on the read-only store" || { not_ok "cb-run on the read-only store (exit $rc)"; sed 's/^/#   /' "$T/err" | head -5; }
[ "$(grep -c 'read-only' "$T/err")" -eq 1 ] && ok "cb-run says once that the store is read-only" \
    || { not_ok "cb-run's read-only note"; sed 's/^/#   /' "$T/err" | head -5; }
python3 - "$T/n1.json" <<'PY' && ok "the missing chunk is computed and not stored; the rest come from the store" || not_ok "missing chunk on a read-only store"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["n_chunks_missing"] == 1 and s["n_chunks_stored"] == 0, s
assert s["n_cached_tokens"] > 0, s
PY
cmp -s "$T/a-ro" "$T/a-full" && ok "at ratio 1 the answer equals full prefill's" || not_ok "ratio 1 vs full on the read-only store"

# Nothing changed: no lock file, the directory, entries, hits, last accesses, counters.
[ ! -e "$S/lock" ] && ok "no lock file made" || not_ok "a lock file was made"
ls -lAR --time-style=full-iso "$S" > "$T/after.ls"
cmp -s "$T/before.ls" "$T/after.ls" && ok "the store directory is as it was" \
    || { not_ok "the store directory changed"; diff "$T/before.ls" "$T/after.ls" | head -5 | sed 's/^/#   /'; }
$STORE --store "$S" ls --json > "$T/after.json"
$STORE --store "$S" stat > "$T/after.stat"
cmp -s "$T/before.json" "$T/after.json" && ok "no access recorded (hits, last access unchanged)" \
    || { not_ok "the index changed"; diff "$T/before.json" "$T/after.json" | head -5 | sed 's/^/#   /'; }
cmp -s "$T/before.stat" "$T/after.stat" && ok "no hit or miss counted" \
    || { not_ok "the counters changed"; diff "$T/before.stat" "$T/after.stat" | head -5 | sed 's/^/#   /'; }
done_testing
