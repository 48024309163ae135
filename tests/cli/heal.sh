#!/bin/sh
# The store mends itself: a bad entry found when read, in any tier, is
# dropped and the chunk computed and put again in the same run; cb-store
# verify reports each kind with status 65.  Local: a layer or the header
# corrupt.  Shared tier on a private redis-server (skipped without one): its
# value list cut short or deleted, a key of another Redis type (one bad
# entry, not the tier down), sizes no put writes; the tier's id registered
# again after a restart without persistence (while a batch reads from it)
# and after its key is deleted.  A tier whose file system fills before its
# capacity (a 1M tmpfs, as root; skipped where it cannot be mounted) sends
# puts on to the next tier, said once.  A gzip of zeros given to cb-chunk
# is an error naming it; a batch's --stats has the shared and store blocks.
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
need_fixture "$M" "self-healing store"
MNT=""
cleanup() {
    redis_kill
    [ -n "$MNT" ] && umount "$MNT" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
sid() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$1/store.json"; }
jget() { python3 -c 'import json,sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(v)' "$1" "$2"; }
# flip FILE OFFSET: one byte of FILE flipped
flip() { python3 - "$1" "$2" <<'PY'
import sys
p, off = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, "rb").read()); b[off] ^= 0x5a; open(p, "wb").write(bytes(b))
PY
}
hdr() { python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(128); print(struct.unpack_from("<I",d,12)[0], struct.unpack_from("<Q",d,96)[0])' "$1"; }

vale_chunks "$M" "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
"$RUN" -m "$M" --chunks "$T/chunks.jsonl" --mode full --no-store-write -n 6 -p "$Q" > "$T/a-full" 2>/dev/null

# -- a gzip of zeros is no empty archive
head -c 65536 /dev/zero | gzip > "$T/zeros.gz"
expect_exit "cb-chunk: a gzip of zeros is an error" 65 "$CHUNK" --chars 100 "$T/zeros.gz"
grep -q "zeros.gz: an archive without members" "$T/err" && [ ! -s "$T/out" ] \
    && ok "it names the file and writes no record" || { not_ok "zeros message"; sed 's/^/#   /' "$T/err" | head -3; }

# -- local: a corrupt layer, then a corrupt header; each dropped when read and put again
"$PRE" -m "$M" --store "$T/l" -q < "$T/chunks.jsonl" > /dev/null || not_ok "precompute on l"
K=$(head -n 1 "$T/chunks.jsonl" | "$PRE" -m "$M" --store "$T/l" -q | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["kv"])')
F=$($STORE --store "$T/l" get "$K")
set -- $(hdr "$F"); H=$1; S=$2
flip "$F" $((H + S / 3))
expect_exit "verify finds the corrupt layer" 65 $STORE --store "$T/l" verify
"$RUN" -m "$M" --store "$T/l" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-l.json" > "$T/ans-l" 2> "$T/err-l"
[ $? -eq 0 ] && grep -q "checksum mismatch.*; dropped from tier main" "$T/err-l" && cmp -s "$T/ans-l" "$T/a-full" \
    && ok "cb-run: a corrupt local layer is dropped with a warning, the answer equals full prefill's" \
    || { not_ok "cb-run on a corrupt local layer"; sed 's/^/#   /' "$T/err-l" | head -5; }
[ "$(jget "$T/st-l.json" store.n_healed)" -eq 1 ] && [ "$(jget "$T/st-l.json" n_chunks_stored)" -ge 1 ] \
    && ok "--stats: store.n_healed 1, the chunk stored again" || not_ok "stats: $(jget "$T/st-l.json" store 2>&1)"
expect_exit "verify after the run: the entry is sound again" 0 $STORE --store "$T/l" verify
$STORE --store "$T/l" get "$K" > /dev/null 2>&1 && ok "and it is in the store" || not_ok "the entry was not put again"
F=$($STORE --store "$T/l" get "$K")
flip "$F" 130
expect_exit "verify finds the corrupt header" 65 $STORE --store "$T/l" verify
"$RUN" -m "$M" --store "$T/l" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-l.json" > "$T/ans-l" 2> "$T/err-l"
grep -q "; dropped from tier main" "$T/err-l" && cmp -s "$T/ans-l" "$T/a-full" && [ "$(jget "$T/st-l.json" store.n_healed)" -eq 1 ] \
    && ok "cb-run: a corrupt local header is dropped, and counted" || { not_ok "corrupt local header"; sed 's/^/#   /' "$T/err-l" | head -5; }
expect_exit "verify after the second run" 0 $STORE --store "$T/l" verify
"$RUN" -m "$M" --store "$T/l" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-l.json" > /dev/null 2> "$T/err-l"
[ ! -s "$T/err-l" ] && [ "$(jget "$T/st-l.json" store.n_healed)" -eq 0 ] && [ "$(jget "$T/st-l.json" n_chunks_missing)" -eq 0 ] \
    && ok "the next run finds every chunk, nothing to mend" || { not_ok "third run"; sed 's/^/#   /' "$T/err-l" | head -3; }

# -- a tier whose file system fills before its capacity (a 1M tmpfs)
mkdir -p "$T/mnt"
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=1M tmpfs "$T/mnt" 2>/dev/null; then
    MNT=$T/mnt
    $STORE --store "$T/f" init --tier "fast=$MNT/t:64M" --tier "main=$T/f/t" > /dev/null
    $STORE --store "$T/f2" init --tier "fast=$MNT/t2:64M" --tier "main=$T/f2/t" > /dev/null
    SZ=$(stat -c %s "$F")
    avail=$(df -B4096 --output=avail "$MNT" | tail -n 1)
    dd if=/dev/zero of="$MNT/filler" bs=4096 count=$((avail - (SZ * 5 / 2 + 4095) / 4096)) 2>/dev/null
    "$PRE" -m "$M" --store "$T/f" -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err-f"; rc=$?
    nf=$($STORE --store "$T/f" ls --tier fast | wc -l); nm=$($STORE --store "$T/f" ls --tier main | wc -l)
    [ $rc -eq 0 ] && [ "$nf" -ge 1 ] && [ "$nf" -le 2 ] && [ "$nm" -ge 7 ] \
        && ok "cb-precompute: a full tier's puts go to the next one ($nf in fast, $nm in main)" \
        || { not_ok "full tier: exit $rc, $nf in fast, $nm in main"; sed 's/^/#   /' "$T/err-f" | head -3; }
    [ "$(grep -c "tier fast: its file system is full" "$T/err-f")" -eq 1 ] && ok "said once on stderr" \
        || { not_ok "the full tier's line"; sed 's/^/#   /' "$T/err-f" | head -3; }
    expect_exit "verify after the fallback" 0 $STORE --store "$T/f" verify
    "$RUN" -m "$M" --store "$T/f2" --chunks "$T/chunks.jsonl" -n 2 -p "$Q" --stats "$T/st-f.json" > /dev/null 2> "$T/err-f"
    [ "$(jget "$T/st-f.json" store.n_full)" -ge 1 ] && [ "$($STORE --store "$T/f2" ls --tier main | wc -l)" -ge 1 ] \
        && ok "cb-run --stats: store.n_full counts the puts sent on" || { not_ok "n_full in stats"; sed 's/^/#   /' "$T/err-f" | head -3; }
    umount "$MNT" && MNT=""
else
    skip "a full tier falls back to the next" "cannot mount a tmpfs here (not root, or no mount permission)"
fi

# -- the shared tier on a private Redis
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -z "$RS" ] || [ -z "$RC" ]; then
    skip "the shared tier mends itself" "no redis-server/redis-cli (make deps)"
    done_testing; exit 0
fi
# nothing saved: a restart loses everything
redis_start || { skip "the shared tier mends itself" "redis-server does not start here"; done_testing; exit 0; }
R="$RC -s $SOCK"
$STORE --store "$T/a" init --tier "main=$T/a/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
"$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null
SID=$(sid "$T/a")
keys=$($R ZRANGE "cb:$SID:lru" 0 -1)
nkeys=$(echo "$keys" | wc -w)
[ "$nkeys" -ge 4 ] && ok "host a wrote $nkeys entries through" || not_ok "write-through: $nkeys entries"
K1=$(echo "$keys" | sed -n 1p); K2=$(echo "$keys" | sed -n 2p); K3=$(echo "$keys" | sed -n 3p); K4=$(echo "$keys" | sed -n 4p)
sound() {   # KEY: its keys as a put leaves them
    [ "$($R TYPE "cb:{$SID:$1}:v")" = list ] && [ "$($R LLEN "cb:{$SID:$1}:v")" = "$($R HGET "cb:{$SID:$1}:m" parts)" ]
}
# fresh HOST: a store with an empty local tier on the shared tier
fresh() { rm -rf "$T/$1"; $STORE --store "$T/$1" init --tier "main=$T/$1/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1; }
runh() { h=$1; shift; "$RUN" -m "$M" --store "$T/$h" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-$h.json" "$@" > "$T/ans-$h" 2> "$T/err-$h"; }

# value cut short (the last part gone), read layer by layer
$R LTRIM "cb:{$SID:$K1}:v" 0 -2 > /dev/null
expect_exit "verify: a value cut short" 65 $STORE --store "$T/a" verify
grep -q "$K1.*parts, its metadata says" "$T/out" "$T/err" && ok "verify names it and says what is wrong" || { not_ok "verify message (cut short)"; sed 's/^/#   /' "$T/out" | head -3; }
fresh b; runh b
grep -q "$K1: its value has .* parts, its metadata says .*; dropped" "$T/err-b" && cmp -s "$T/ans-b" "$T/a-full" \
    && [ "$(jget "$T/st-b.json" n_chunks_missing)" -eq 1 ] && [ "$(jget "$T/st-b.json" store.n_healed)" -eq 1 ] \
    && ok "streamed: a value cut short is dropped, one chunk computed, counted in --stats" \
    || { not_ok "streamed value cut short"; sed 's/^/#   /' "$T/err-b" | head -5; }
sound "$K1" && ok "and written back whole in the same run" || not_ok "$K1 not written back"

# value deleted; found by verify, then mended by cb-precompute on the host that has it locally
$R DEL "cb:{$SID:$K2}:v" > /dev/null
expect_exit "verify: a value deleted" 65 $STORE --store "$T/a" verify
grep -q "$K2.*its value is missing" "$T/out" "$T/err" && ok "verify says its value is missing" || { not_ok "verify message (deleted)"; sed 's/^/#   /' "$T/out" | head -3; }
"$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err-p"
sound "$K2" && grep -q "$K2: its value is missing; dropped" "$T/err-p" \
    && ok "cb-precompute replaces it (the local copy written through)" || { not_ok "precompute and a deleted value"; sed 's/^/#   /' "$T/err-p" | head -3; }

# a value of another Redis type: one bad entry, not the tier down; fetched whole this time
$R DEL "cb:{$SID:$K3}:v" > /dev/null; $R SET "cb:{$SID:$K3}:v" junk > /dev/null
expect_exit "verify: a value of another type" 65 $STORE --store "$T/a" verify
grep -q "$K3.*not a list" "$T/out" "$T/err" && ok "verify says it is not a list" || { not_ok "verify message (type)"; sed 's/^/#   /' "$T/out" | head -3; }
fresh c; CB_STORE_STREAM=0 runh c
! grep -q "not used for 5 s\|not used again" "$T/err-c" && [ "$(jget "$T/st-c.json" n_chunks_missing)" -eq 1 ] \
    && grep -q "$K3: its value is not a list; dropped" "$T/err-c" && cmp -s "$T/ans-c" "$T/a-full" \
    && ok "fetched: a value of another type is one missing chunk, dropped, the tier still used" \
    || { not_ok "value of another type (fetched)"; sed 's/^/#   /' "$T/err-c" | head -5; }
sound "$K3" && ok "and written back" || not_ok "$K3 not written back"
$R DEL "cb:{$SID:$K3}:v" > /dev/null; $R SADD "cb:{$SID:$K3}:v" junk > /dev/null
fresh c; runh c
! grep -q "not used for 5 s\|not used again" "$T/err-c" && [ "$(jget "$T/st-c.json" n_chunks_missing)" -eq 1 ] && sound "$K3" \
    && ok "streamed: a value of another type, the same" || { not_ok "value of another type (streamed)"; sed 's/^/#   /' "$T/err-c" | head -5; }

# metadata of another type, and sizes no put writes
$R DEL "cb:{$SID:$K4}:m" > /dev/null; $R SET "cb:{$SID:$K4}:m" junk > /dev/null
expect_exit "verify: metadata of another type" 65 $STORE --store "$T/a" verify
fresh d; runh d
[ "$(jget "$T/st-d.json" store.n_healed)" -eq 1 ] && grep -q "$K4: its metadata is not a hash; dropped" "$T/err-d" && sound "$K4" \
    && ok "metadata of another type: dropped, the chunk computed and written back" || { not_ok "metadata of another type"; sed 's/^/#   /' "$T/err-d" | head -5; }
used0=$($R GET "cb:$SID:used")
$R HSET "cb:{$SID:$K1}:m" bytes 1099511627776 > /dev/null
expect_exit "verify: 2^40 bytes in the metadata" 65 $STORE --store "$T/a" verify
fresh e; runh e
[ "$(jget "$T/st-e.json" n_chunks_missing)" -eq 1 ] && grep -q "$K1: its metadata is malformed.*; dropped" "$T/err-e" && sound "$K1" \
    && ok "2^40 bytes: not a silent miss, dropped and written back" || { not_ok "absurd size"; sed 's/^/#   /' "$T/err-e" | head -5; }
[ "$($R GET "cb:$SID:used")" -eq "$used0" ] && ok "the accounting is as before ($used0 bytes)" || not_ok "used $($R GET "cb:$SID:used"), was $used0"
expect_exit "verify after the mending" 0 $STORE --store "$T/a" verify
$R DEL "cb:{$SID:$K2}:m" > /dev/null; $R SET "cb:{$SID:$K2}:m" junk > /dev/null
expect_exit "verify --repair drops what it finds (metadata of another type)" 0 $STORE --store "$T/a" verify --repair
grep -q "$K2.*not a hash (dropped)" "$T/out" "$T/err" && [ "$($R EXISTS "cb:{$SID:$K2}:m")" -eq 0 ] \
    && ok "and the broken entry is gone" || { not_ok "verify --repair left $K2"; sed 's/^/#   /' "$T/out" | head -3; }
sum=0; for k in $($R ZRANGE "cb:$SID:lru" 0 -1); do sum=$((sum + $($R HGET "cb:{$SID:$k}:m" bytes))); done
[ "$($R GET "cb:$SID:used")" -eq "$sum" ] && ok "the accounting matches the entries left ($sum bytes)" || not_ok "used $($R GET "cb:$SID:used"), entries $sum"

# -- the tier's id registered again: Redis restarted without persistence while a batch reads
python3 -c 'import json
for i in range(40): print(json.dumps({"id": i, "question": "Who built the bridge over the Vale? (%d)" % i}))' > "$T/q.jsonl"
fresh g
"$RUN" -m "$M" --store "$T/g" --chunks "$T/chunks.jsonl" --no-store-write -n 24 --batch-size 1 --batch "$T/q.jsonl" \
    --stats "$T/st-g.json" > "$T/ans-g" 2> "$T/err-g" &
bpid=$!
sleep 1; redis_kill; redis_start || not_ok "restart"
$R EXISTS cb:tier:shared | grep -q 0 && ok "restarted without persistence: the tier's id is gone" || not_ok "the id survived the restart"
wait $bpid; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$T/ans-g")" -eq 40 ] && ok "the batch answers every question across the restart" \
    || { not_ok "batch across the restart (exit $rc)"; sed 's/^/#   /' "$T/err-g" | head -5; }
[ "$(jget "$T/st-g.json" shared.tier)" = shared ] && [ "$(jget "$T/st-g.json" store.n_healed)" -eq 0 ] \
    && ok "a batch's --stats has the shared and store blocks" || not_ok "batch stats: $(head -c 300 "$T/st-g.json")"
"$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err-p"
[ "$($R GET cb:tier:shared)" = "$SID" ] && cat "$T/err-g" "$T/err-p" | grep -q "registered again as $SID" \
    && ok "the next connection (the batch's, or a precompute's) registers the same id again, and says so" || { not_ok "re-registered: $($R GET cb:tier:shared)"; sed 's/^/#   /' "$T/err-p" | head -3; }
fresh h
[ "$(sid "$T/h")" = "$SID" ] && ok "a store made after the restart joins the same tier" || not_ok "new store's id $(sid "$T/h")"
runh h
[ "$(jget "$T/st-h.json" n_chunks_missing)" -eq 0 ] && cmp -s "$T/ans-h" "$T/a-full" \
    && ok "sharing resumes: the new host answers from the shared tier" || { not_ok "sharing after the restart"; sed 's/^/#   /' "$T/err-h" | head -3; }
$R DEL cb:tier:shared > /dev/null
$STORE --store "$T/b" stat > /dev/null 2> "$T/err-s"
[ "$($R GET cb:tier:shared)" = "$SID" ] && ok "its key deleted: registered again by the next connection" || not_ok "after DEL: $($R GET cb:tier:shared)"
fresh i
[ "$(sid "$T/i")" = "$SID" ] && ok "and the next init joins it" || not_ok "init after DEL: $(sid "$T/i")"
redis_kill
done_testing
