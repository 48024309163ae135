#!/bin/sh
# The coded KV element types kivi4 and coded through the programs:
# cb-precompute --kv-type kivi4 writes files a third of f16's, coded
# version 4 files of about a fifth, cb-store verifies them, states their
# bytes per token and recodes f16 to coded and back, cb-run answers from
# them in reuse and blend modes, locally and streamed layer by layer from a
# shared tier on Redis, with the same answer (skipped where redis-server is
# missing), and from SmolLM2's coded files where that model is present.
# (Not "ratio 1 equals full prefill": the leading chunk is reused as it
# is, and both types are lossy.)
. "$(dirname "$0")/lib.sh"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
GEN=${BUILD:-build/rel}/tests/cb-gen-fixture
# rows of 256 elements (4 KV heads of 64), so that a layer is pages, not padding
M=$T/wide.gguf
if ! "$GEN" --embd 256 --heads 4 --kv-heads 4 --type q8_0 "$M" > /dev/null 2> "$T/err"; then
    skip "kivi4 KV files" "cb-gen-fixture failed: $(head -c 100 "$T/err")"
    done_testing; exit 0
fi
# chunks of 96 tokens, so that a layer is mostly whole pages
mkdir -p "$T/docs"
for i in 1; do
    for j in 1 2 3 4; do
        printf 'Document %s, part %s. The river Vale runs past the town of Kelby %s. Its bridge was built in 19%s0 by the Norden company. ' $i $j $i $i
    done > "$T/docs/d$i.txt"
done
"$BINDIR_B/cb-chunk" -m "$M" --tokens 96 "$T/docs" > "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
stat_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$T/st-$1.json" "$2"; }

for t in f16 kivi4 coded; do
    "$PRE" -m "$M" --store "$T/$t" --kv-type $t -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err" \
        && ok "cb-precompute --kv-type $t" || { not_ok "cb-precompute --kv-type $t"; sed 's/^/#   /' "$T/err" | head -3; }
done
expect_exit "cb-store verify: kivi4 entries" 0 "$STORE" --store "$T/kivi4" verify
expect_exit "cb-store verify: coded entries" 0 "$STORE" --store "$T/coded" verify
# every entry's layers as cbkv(5) sizes them (5/16 of f16's before the padding to pages), and
# the files in all a third of f16's or less
python3 - "$T/f16" "$T/kivi4" <<'PY' && ok "kivi4 files: layers of 5/16 of f16's bytes, files under 0.38 of f16's" || not_ok "kivi4 sizes"
import glob, os, struct, sys
def files(d):
    return {os.path.basename(p): open(p, "rb").read() for p in glob.glob(d + "/**/*.kv", recursive=True)}
f16, k4 = files(sys.argv[1]), files(sys.argv[2])
assert f16 and sorted(f16) == sorted(k4), (sorted(f16), sorted(k4))
page = lambda x: (x + 4095) // 4096 * 4096
raw = [0, 0]
for key, b in k4.items():
    L, heads, dim = struct.unpack_from("<3I", b, 48)
    typ, n = struct.unpack_from("<2I", b, 72)
    S, B = struct.unpack_from("<2Q", b, 96)
    w = heads * dim
    assert struct.unpack_from("<I", b, 8)[0] == 3 and typ == 1024, key
    kb, vb = 4 * w * ((n + 31) // 32) + n * w // 2, n * w // 32 * 20
    assert B == kb and S == page(kb + vb), (key, B, S, kb, vb)
    assert struct.unpack_from("<Q", f16[key], 96)[0] == page(4 * n * w), key
    raw[0] += 4 * n * w; raw[1] += n * w * 5 // 4
sf, sk = sum(map(len, f16.values())), sum(map(len, k4.values()))
print("# %d entries: f16 %d bytes, kivi4 %d (%.3f); layers before padding %.4f" % (len(k4), sf, sk, sk / sf, raw[1] / raw[0]))
assert raw[1] * 16 == raw[0] * 5 and sk / sf < 0.38, (sf, sk)
PY
# coded: version 4, its table tiling the body in whole pages, each layer's
# coded bytes within its span, the files under a quarter of f16's (about
# a fifth, and the padding of short chunks' layers to pages)
python3 - "$T/f16" "$T/coded" <<'PY' && ok "coded files: version 4, layers tiled by the table, under 0.25 of f16's" || not_ok "coded sizes"
import glob, os, struct, sys
def files(d):
    return {os.path.basename(p): open(p, "rb").read() for p in glob.glob(d + "/**/*.kv", recursive=True)}
f16, cd = files(sys.argv[1]), files(sys.argv[2])
assert f16 and sorted(f16) == sorted(cd), (sorted(f16), sorted(cd))
for key, b in cd.items():
    H, = struct.unpack_from("<I", b, 12)
    L, heads, dim = struct.unpack_from("<3I", b, 48)
    typ, n, pos0, lead = struct.unpack_from("<4I", b, 72)
    S, B, total = struct.unpack_from("<3Q", b, 96)
    assert struct.unpack_from("<I", b, 8)[0] == 4 and typ == 1025 and B == 0 and total == len(b), key
    table, at = 128 + 4 * (n + lead) + 16 * L, H
    for l in range(L):
        off, span = struct.unpack_from("<2Q", b, table + 16 * l)
        assert off == at and span % 4096 == 0 and 0 < span <= S, (key, l, off, span)
        zk, zv = struct.unpack_from("<2I", b, off + 12)
        assert 32 + 4 * (heads * dim + n) + zk + zv <= span, (key, l)
        at += span
    assert at == len(b), key
sf, sc = sum(map(len, f16.values())), sum(map(len, cd.values()))
print("# %d entries: f16 %d bytes, coded %d (%.3f)" % (len(cd), sf, sc, sc / sf))
assert sc / sf < 0.25, (sf, sc)
PY
"$STORE" --store "$T/coded" stat > "$T/stat" 2>&1
awk '$2 == "coded" && $NF + 0 > 0 { found = 1; print "# coded bytes/token: " $NF } END { exit !found }' "$T/stat" \
    && ok "cb-store stat: coded entries' bytes per token" || { not_ok "stat coded"; sed 's/^/#   /' "$T/stat" | head -8; }
# f16 -> coded -> f16: the entries keep their keys and stay readable
cp -r "$T/f16" "$T/rc"
"$STORE" --store "$T/rc" recode --kv-type coded > /dev/null 2> "$T/err" && "$STORE" --store "$T/rc" verify > /dev/null 2>&1 \
    && grep -q "coded" "$T/err" && ok "cb-store recode f16 -> coded: verified" || { not_ok "recode -> coded"; sed 's/^/#   /' "$T/err" | head -3; }
"$STORE" --store "$T/rc" recode --kv-type f16 > /dev/null 2> "$T/err" && "$STORE" --store "$T/rc" verify > /dev/null 2>&1 \
    && ok "cb-store recode coded -> f16: verified" || { not_ok "recode coded -> f16"; sed 's/^/#   /' "$T/err" | head -3; }

Q="Who built the bridge over the Vale?"
# run NAME STORE ARGS...: cb-run from STORE, answer in $T/a-NAME, stats in $T/st-NAME.json
run() {
    name=$1 s=$2; shift 2
    "$RUN" -m "$M" --store "$s" --chunks "$T/chunks.jsonl" --no-store-write -n 6 -p "$Q" \
        --stats "$T/st-$name.json" "$@" > "$T/a-$name" 2> "$T/err-$name"
}
for mode in reuse blend; do
    for t in f16 kivi4 coded rc; do
        run $mode-$t "$T/$t" --mode $mode
    done
    for t in coded rc; do
        if [ -s "$T/a-$mode-$t" ] && [ "$(stat_of $mode-$t n_chunks_missing)" -eq 0 ] \
            && [ "$(stat_of $mode-$t n_cached_tokens)" -gt 0 ]; then
            ok "cb-run --mode $mode answers from $t files (no chunk missing)"
        else
            not_ok "cb-run --mode $mode from $t"; sed 's/^/#   /' "$T/err-$mode-$t" | head -5
        fi
    done
    if [ -s "$T/a-$mode-kivi4" ] && [ "$(stat_of $mode-kivi4 n_chunks_missing)" -eq 0 ] \
        && [ "$(stat_of $mode-kivi4 n_cached_tokens)" -gt 0 ]; then
        ok "cb-run --mode $mode answers from kivi4 files (no chunk missing)"
    else
        not_ok "cb-run --mode $mode from kivi4"; sed 's/^/#   /' "$T/err-$mode-kivi4" | head -5
    fi
    python3 - "$(stat_of $mode-f16 load_bytes)" "$(stat_of $mode-kivi4 load_bytes)" <<'PY' \
        && ok "--mode $mode loads under 0.38 of f16's bytes" || not_ok "--mode $mode load_bytes"
import sys
f, k = float(sys.argv[1]), float(sys.argv[2])
print("# load_bytes: f16 %d, kivi4 %d" % (f, k))
assert f > 0 and k / f < 0.38, (f, k)
PY
    python3 - "$(stat_of $mode-f16 load_bytes)" "$(stat_of $mode-coded load_bytes)" <<'PY' \
        && ok "--mode $mode loads under 0.25 of f16's bytes from coded files" || not_ok "--mode $mode coded load_bytes"
import sys
f, k = float(sys.argv[1]), float(sys.argv[2])
print("# load_bytes: f16 %d, coded %d" % (f, k))
assert f > 0 and 0 < k and k / f < 0.25, (f, k)
PY
done

# -- SmolLM2 (the tests' real model), where present: coded files of real KV
SM=${CB_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$SM" ]; then
    "$BINDIR_B/cb-chunk" -m "$SM" --tokens 200 "$T/docs" > "$T/sm.jsonl" \
        && "$PRE" -m "$SM" --store "$T/sm" --kv-type coded -q < "$T/sm.jsonl" > /dev/null 2> "$T/err" \
        && "$RUN" -m "$SM" --store "$T/sm" --chunks "$T/sm.jsonl" --no-store-write -n 6 -p "$Q" \
            --mode blend --stats "$T/st-sm.json" > "$T/a-sm" 2> "$T/err-sm" \
        && [ -s "$T/a-sm" ] && [ "$(stat_of sm n_chunks_missing)" -eq 0 ] \
        && ok "SmolLM2: cb-run answers from coded files" \
        || { not_ok "SmolLM2 coded"; sed 's/^/#   /' "$T/err" "$T/err-sm" 2>/dev/null | head -5; }
    "$STORE" --store "$T/sm" stat 2>/dev/null | awk '$2 == "coded" { print "# SmolLM2 coded bytes/token: " $NF }'
else
    skip "SmolLM2: cb-run answers from coded files" "no $SM (make test fetches it)"
fi

# -- the shared tier: a host with an empty local store streams kivi4 files layer by layer
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -z "$RS" ] || [ -z "$RC" ]; then
    skip "kivi4 through the shared tier" "no redis-server/redis-cli (make deps)"
    done_testing; exit
fi
if ! redis_start; then
    skip "kivi4 through the shared tier" "redis-server does not start here"
    done_testing; exit
fi
for h in a b; do
    "$STORE" --store "$T/$h" init --tier "main=$T/$h/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
done
"$PRE" -m "$M" --store "$T/a" --kv-type kivi4 -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err" \
    && ok "cb-precompute --kv-type kivi4 writes through to the shared tier" || not_ok "precompute on host a"
# b holds nothing locally: its chunks stream from Redis, each layer placed as it arrives
run shared "$T/b" --mode blend
[ "$(stat_of shared n_chunks_missing)" -eq 0 ] && cmp -s "$T/a-shared" "$T/a-blend-kivi4" \
    && ok "streamed kivi4 files give the local files' answer" \
    || { not_ok "streamed kivi4"; sed 's/^/#   /' "$T/err-shared" | head -5; }
expect_exit "cb-store verify on the streaming host" 0 "$STORE" --store "$T/b" verify
# coded: its layers of varying size are the shared tier's parts, streamed the same way
"$RC" -s "$SOCK" flushall > /dev/null
for h in c d; do
    "$STORE" --store "$T/$h" init --tier "main=$T/$h/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
done
"$PRE" -m "$M" --store "$T/c" --kv-type coded -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err" \
    && ok "cb-precompute --kv-type coded writes through to the shared tier" || not_ok "precompute on host c"
run shared-coded "$T/d" --mode blend
[ "$(stat_of shared-coded n_chunks_missing)" -eq 0 ] && cmp -s "$T/a-shared-coded" "$T/a-blend-coded" \
    && ok "streamed coded files give the local files' answer" \
    || { not_ok "streamed coded"; sed 's/^/#   /' "$T/err-shared-coded" | head -5; }
expect_exit "cb-store verify on the coded streaming host" 0 "$STORE" --store "$T/d" verify
done_testing
