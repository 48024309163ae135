#!/bin/sh
# The shared tier on Redis (issue 16) with a real redis-server on a loopback
# port and a unix socket inside the test's directory, started and stopped
# here: write-through, a host with an empty local store answering from it,
# capacity, a corrupted value dropped and computed, the server killed and
# restarted, verify/gc, and three "hosts" working at once with clients
# killed at random and one Redis restart.  Skips where redis-server is missing.
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -z "$RS" ] || [ -z "$RC" ] || [ ! -f "$M" ]; then
    skip "shared tier on Redis" "no redis-server/redis-cli (make deps) or no $M"
    done_testing; exit 0
fi
PORT=$(free_port) # and $SOCK; nothing saved
redis_start || { skip "shared tier on Redis" "redis-server does not start here ($(tail -n 2 "$T/redis.log" 2>/dev/null))"; done_testing; exit 0; }
R="$RC -s $SOCK"

vale_chunks "$M" "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
"$RUN" -m "$M" --chunks "$T/chunks.jsonl" --mode full --no-store-write -n 6 -p "$Q" > "$T/a-full" 2>/dev/null \
    || { not_ok "cb-run --mode full"; done_testing; exit 1; }
# run HOST [ARGS]: cb-run at ratio 1 on store HOST; answer in $T/ans-HOST, stats in $T/st-HOST.json
run() { h=$1; shift; "$RUN" -m "$M" --store "$T/$h" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-$h.json" "$@" > "$T/ans-$h" 2> "$T/err-$h"; }
stat_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$T/st-$1.json" "$2"; }

# -- init
expect_exit "init with a shared tier over TCP" 0 $STORE --store "$T/a" init --tier "main=$T/a/t" --tier "shared=redis://127.0.0.1:$PORT/0:64M"
grep -q '"url": "redis://127.0.0.1:'"$PORT"'/0"' "$T/a/store.json" && grep -q '"capacity": 67108864' "$T/a/store.json" \
    && ok "store.json names the shared tier and its capacity" || not_ok "store.json shared tier"
expect_exit "init with a shared tier over a unix socket" 0 $STORE --store "$T/b" init --tier "main=$T/b/t" --tier "shared=unix://$SOCK:64M"
[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/a/store.json")" = \
  "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/b/store.json")" ] \
    && ok "both stores share the tier's id" || not_ok "the shared tier's id differs"
expect_exit "init: a shared tier that cannot be reached" 74 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=redis://127.0.0.1:1/0:1M"
expect_exit "init: a malformed address" 64 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=redis://127.0.0.1:99999:1M"
expect_exit "init: a shared tier alone" 64 $STORE --store "$T/x" init --tier "shared=unix://$SOCK"

# -- write-through, and a host with an empty local store answering from Redis
"$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null && ok "cb-precompute on host a" || not_ok "cb-precompute on host a"
nkeys=$($STORE --store "$T/a" ls --tier main | wc -l)
[ "$($STORE --store "$T/b" ls --tier shared | wc -l)" -eq "$nkeys" ] && ok "host b sees a's $nkeys entries in the shared tier" \
    || not_ok "host b sees the shared entries ($($STORE --store "$T/b" ls --tier shared | wc -l) of $nkeys)"
[ "$($STORE --store "$T/b" ls --tier main | wc -l)" -eq 0 ] && ok "host b's local tier is empty" || not_ok "host b's local tier"
run b
[ -s "$T/ans-b" ] && [ "$(stat_of b n_chunks_missing)" -eq 0 ] && ok "host b answers from the shared tier (no chunk missing)" \
    || { not_ok "host b from the shared tier"; sed 's/^/#   /' "$T/err-b" | head -5; }
cmp -s "$T/ans-b" "$T/a-full" && ok "at ratio 1 b's answer equals full prefill's" || not_ok "b at ratio 1 vs full"
[ "$($STORE --store "$T/b" ls --tier main | wc -l)" -eq "$nkeys" ] && ok "the fetched entries are kept in b's local tier" \
    || not_ok "promotion into b's local tier"
expect_exit "verify on a" 0 $STORE --store "$T/a" verify
expect_exit "verify on b" 0 $STORE --store "$T/b" verify
expect_exit "gc on b" 0 $STORE --store "$T/b" gc
expect_exit "stat on b" 0 $STORE --store "$T/b" stat
grep -q "^shared  *$nkeys " "$T/out" && ok "stat shows the shared tier" || not_ok "stat shows the shared tier"

# -- cb-profile measures the shared tier's load throughput, and leaves nothing in it
n_before=$($R ZCARD "cb:$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/b/store.json"):lru")
$BINDIR_B/cb-profile -m "$M" --store "$T/b" --lengths 64 --ratios 0.25 --repeat 2 -o json > "$T/p.json" 2> "$T/err-p"
python3 - "$T/p.json" <<'PY' && ok "cb-profile measures the shared tier" || { not_ok "cb-profile and the shared tier"; sed 's/^/#   /' "$T/err-p" | head -5; }
import json, sys
p = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in p["tiers"]}
assert set(t) == {"main", "shared"} and t["shared"]["cold_mbs"] > 0, p["tiers"]
PY
[ "$($R ZCARD "cb:$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/b/store.json"):lru")" -eq "$n_before" ] \
    && ok "cb-profile's test entry is gone from the shared tier" || not_ok "cb-profile left its test entry"
$STORE --store "$T/b" place -m "$M" --json > "$T/place.json" 2> "$T/err-pl"
python3 - "$T/place.json" <<'PY' && ok "cb-store place reports the shared tier's streamed load time" || { not_ok "place and the shared tier"; sed 's/^/#   /' "$T/err-pl" | head -3; }
import json, sys
p = json.load(open(sys.argv[1]))
assert p["shared"]["name"] == "shared" and p["shared"]["load_ms"] > 0 and p["shared"]["hidden"] == (p["shared"]["load_ms"] <= p["recompute_ms"]), p
PY

# -- a corrupted value: dropped with a warning, the chunk computed
SID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/a/store.json")
K=$($STORE --store "$T/a" ls --tier shared | head -n 1 | cut -d' ' -f1)
L=$(python3 -c 'import struct,sys; print(struct.unpack_from("<I", open(sys.argv[1], "rb").read(64), 48)[0])' "$($STORE --store "$T/a" get "$K")")
[ "$($R LLEN "cb:{$SID:$K}:v")" -eq $((L + 1)) ] && [ "$($R HGET "cb:{$SID:$K}:m" parts)" -eq $((L + 1)) ] \
    && ok "a value is split by layer: the header, then $L layers" || not_ok "parts: $($R LLEN "cb:{$SID:$K}:v"), $L layers"
# Redis Cluster: every key of one entry (metadata, value, an upload) hashes to one slot, as a
# cluster-mode server of our own (no slots served: CLUSTER KEYSLOT only) computes it
CS=$T/cluster.sock
if "$RS" --port 0 --unixsocket "$CS" --cluster-enabled yes --cluster-config-file "$T/nodes.conf" --save "" \
        --appendonly no --dir "$T" --daemonize yes --pidfile "$T/cluster.pid" --logfile "$T/cluster.log" > /dev/null 2>&1; then
    i=0; while [ ! -S "$CS" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    bad=0; n_e=0
    for k in $($R ZRANGE "cb:$SID:lru" 0 -1); do
        n_e=$((n_e + 1))
        slots=$(for x in $($R KEYS "cb:{$SID:$k}:*") "cb:{$SID:$k}:t:0123456789abcdef"; do "$RC" -s "$CS" CLUSTER KEYSLOT "$x"; done | sort -u | wc -l)
        [ "$slots" -eq 1 ] || bad=$((bad + 1))
    done
    kill "$(cat "$T/cluster.pid")" 2>/dev/null
    [ $n_e -gt 0 ] && [ $bad -eq 0 ] && ok "Redis Cluster: each of $n_e entries' keys share one hash slot" \
        || not_ok "hash slots: $bad of $n_e entries span several"
else
    skip "Redis Cluster hash slots" "redis-server does not start in cluster mode here"
fi
python3 - "$SOCK" "cb:{$SID:$K}:v" <<'PY' && ok "a byte of a value flipped in Redis" || not_ok "corrupt a value"
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def cmd(*a):
    s.sendall(b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x), x) for x in a]))
    return s.recv(1 << 24)
key = sys.argv[2].encode()
r = cmd(b"LINDEX", key, b"0")
while r.count(b"\r\n") < 2 or len(r) < int(r[1:r.index(b"\r\n")]) + r.index(b"\r\n") + 4:
    r += s.recv(1 << 24)
h = r.index(b"\r\n"); n = int(r[1:h]); v = bytearray(r[h + 2:h + 2 + n])
v[n // 2] ^= 0x40
assert cmd(b"LSET", key, b"0", bytes(v)).startswith(b"+OK")
PY
expect_exit "verify finds the bad value" 65 $STORE --store "$T/a" verify
grep -q "$K" "$T/out" && ok "verify names the entry" || not_ok "verify names the entry"
$STORE --store "$T/c" init --tier "main=$T/c/t" --tier "shared=unix://$SOCK:64M" 2>/dev/null
run c
[ "$(stat_of c n_chunks_missing)" -ge 1 ] && grep -q "header checksum mismatch.*; dropped" "$T/err-c" \
    && ok "cb-run: the bad entry is dropped with a warning and the chunk computed" \
    || { not_ok "cb-run on a corrupt value"; sed 's/^/#   /' "$T/err-c" | head -5; }
cmp -s "$T/ans-c" "$T/a-full" && ok "and the answer equals full prefill's" || not_ok "c at ratio 1 vs full"
[ "$($R HGET "cb:{$SID:$K}:m" hits)" = 0 ] && ok "the bad entry was dropped, and put again sound once c computed it" \
    || not_ok "the bad entry in Redis"
expect_exit "verify after the drop" 0 $STORE --store "$T/a" verify

# -- streamed layer by layer: a chunk only the shared tier holds is read from it while the prefill
#    runs; cb-run --ratio auto plans with the shared tier's measured speed (cb-profile on b above)
rm -f "$T/b/t"/*.kv; $STORE --store "$T/b" verify --repair > /dev/null 2>&1
"$RUN" -v -m "$M" --store "$T/b" --chunks "$T/chunks.jsonl" --ratio auto -n 6 -p "$Q" --stats "$T/st-b.json" > "$T/ans-b" 2> "$T/err-b"
grep -q -- "--ratio auto: .* in tier shared " "$T/err-b" && [ "$(stat_of b n_chunks_missing)" -eq 0 ] \
    && ok "streamed: --ratio auto plans with the shared tier's profile" || { not_ok "--ratio auto and the shared tier"; sed 's/^/#   /' "$T/err-b" | head -5; }
[ "$($STORE --store "$T/b" ls --tier main | wc -l)" -eq "$nkeys" ] && ok "streamed entries are kept locally after the answer" \
    || not_ok "streamed entries kept: $($STORE --store "$T/b" ls --tier main | wc -l) of $nkeys"
# flip_part KEY PART: one byte of part PART (0 the header, l+1 layer l) of an entry's value flipped in Redis
flip_part() {
    python3 - "$SOCK" "cb:{$SID:$1}:v" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def cmd(*a):
    s.sendall(b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x), x) for x in a]))
    return s.recv(1 << 24)
key = sys.argv[2].encode(); part = sys.argv[3].encode()
r = cmd(b"LINDEX", key, part)
while r.count(b"\r\n") < 2 or len(r) < int(r[1:r.index(b"\r\n")]) + r.index(b"\r\n") + 4:
    r += s.recv(1 << 24)
h = r.index(b"\r\n"); n = int(r[1:h]); v = bytearray(r[h + 2:h + 2 + n])
v[n // 3] ^= 0x10
assert cmd(b"LSET", key, part, bytes(v)).startswith(b"+OK")
PY
}
K2=$($STORE --store "$T/a" ls --tier shared | tail -n 1 | cut -d' ' -f1)
$STORE --store "$T/a" get "$K2" -o "$T/k2.kv" > /dev/null 2>&1
# the last layer's part corrupt: every earlier layer of the chunk was already loaded and used
flip_part "$K2" "$L" && ok "the last layer's part of a value corrupted in Redis" || not_ok "corrupt a layer part"
$STORE --store "$T/e" init --tier "main=$T/e/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
"$RUN" -m "$M" --store "$T/e" --chunks "$T/chunks.jsonl" --no-store-write -n 1 -p "$Q" --logits-out "$T/lg-e1" \
    --stats "$T/st-e.json" > /dev/null 2> "$T/err-e"; rc=$?
[ $rc -eq 0 ] && grep -q "layer $((L - 1)) checksum mismatch.*; dropped" "$T/err-e" && [ "$(stat_of e n_chunks_missing)" -eq 1 ] \
    && ok "streamed: a corrupt layer part mid-value is found, warned of, and its chunk computed" \
    || { not_ok "streamed corrupt layer (exit $rc)"; sed 's/^/#   /' "$T/err-e" | head -5; }
[ "$($R EXISTS "cb:{$SID:$K2}:m")" -eq 0 ] && ok "the corrupt entry is dropped from the shared tier" || not_ok "corrupt entry still there"
"$RUN" -m "$M" --store "$T/e" --chunks "$T/chunks.jsonl" --no-store-write -n 1 -p "$Q" --logits-out "$T/lg-e2" \
    > /dev/null 2> "$T/err-e2"
cmp -s "$T/lg-e1" "$T/lg-e2" && ok "no corrupt read: the logits equal those of a run where that chunk is missing" \
    || not_ok "logits after a corrupt layer differ from the chunk computed"
$STORE --store "$T/a" rm "$K2" > /dev/null 2>&1; $STORE --store "$T/a" put "$T/k2.kv" > /dev/null 2>&1
flip_part "$K2" 1
rm -rf "$T/e"; $STORE --store "$T/e" init --tier "main=$T/e/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
run e --no-store-write
grep -q "layer 0 checksum mismatch" "$T/err-e" && cmp -s "$T/ans-e" "$T/a-full" \
    && ok "streamed: a corrupt first layer, and the answer at ratio 1 equals full prefill's" \
    || { not_ok "streamed corrupt middle layer at ratio 1"; sed 's/^/#   /' "$T/err-e" | head -5; }
$STORE --store "$T/a" rm "$K2" > /dev/null 2>&1; $STORE --store "$T/a" put "$T/k2.kv" > /dev/null 2>&1

# -- a read-only store (a read-only bind mount as root, else a chmod'ed copy) streams from the shared
#    tier too, and keeps nothing locally
$STORE --store "$T/rs" init --tier "main=$T/rs/t" --tier "shared=unix://$SOCK:64M" > /dev/null 2>&1
mkdir -p "$T/ro"; how=""
if [ "$(id -u)" -eq 0 ] && mount -o bind,ro "$T/rs" "$T/ro" 2>/dev/null; then
    if touch "$T/ro/.w" 2>/dev/null; then rm -f "$T/ro/.w"; umount "$T/ro"; else how=mount; fi
elif [ "$(id -u)" -ne 0 ]; then
    rmdir "$T/ro"; cp -a "$T/rs" "$T/ro" && chmod -R a-w "$T/ro" && how=chmod
fi
if [ -n "$how" ]; then
    run ro
    [ "$(stat_of ro n_chunks_missing)" -eq 0 ] && cmp -s "$T/ans-ro" "$T/a-full" && [ -z "$(ls "$T/ro/t")" ] \
        && ok "read-only store ($how): chunks streamed from the shared tier, answer equals full prefill's, nothing kept" \
        || { not_ok "read-only store and the shared tier"; sed 's/^/#   /' "$T/err-ro" | head -5; }
    [ $how = mount ] && umount "$T/ro"; [ $how = chmod ] && chmod -R u+w "$T/ro"
else
    skip "read-only store and the shared tier" "neither a read-only bind mount nor a chmod'ed store can be set up here"
fi

# -- the server dies, or hangs, in the middle of a streamed value (a fake server that serves the
#    header and layer 0 of K2, then closes the connection or stops answering; time-out 500 ms)
CK=$($R HGET "cb:{$SID:$K2}:m" checksum)
fake_stream() {   # MODE (close|hang)
    python3 - "$T/fs.sock" "$T/k2.kv" "$K2" "$CK" "$1" <<'PY' &
import socket, struct, sys, threading, time
path, kv, key, ck, mode = sys.argv[1:6]
data = open(kv, "rb").read()
H = struct.unpack_from("<I", data, 12)[0]; L = struct.unpack_from("<I", data, 48)[0]; S = struct.unpack_from("<Q", data, 96)[0]
parts = [data[:H]] + [data[H + l * S:H + (l + 1) * S] for l in range(L)]
def bulk(b): return b"$%d\r\n%s\r\n" % (len(b), b)
def serve(c):
    buf = b""; served = 0
    while True:
        d = c.recv(65536)
        if not d:
            return
        buf += d
        while buf.startswith(b"*") and b"\r\n" in buf:
            try:
                h = buf.index(b"\r\n"); n = int(buf[1:h]); at = h + 2; args = []
                for _ in range(n):
                    e = buf.index(b"\r\n", at); ln = int(buf[at + 1:e]); args.append(buf[e + 2:e + 2 + ln]); at = e + 4 + ln
                    if at > len(buf): raise ValueError
            except ValueError:
                break
            buf = buf[at:]; op = args[0].upper()
            if op == b"EVAL" and b"HMGET" in args[1]:
                if args[5].decode() == key:
                    m = [str(len(data)).encode(), ck.encode(), str(len(parts)).encode(), b"24", b"1", b"1", b"0"]
                    c.sendall(b"*7\r\n" + b"".join(bulk(x) for x in m))
                else:
                    c.sendall(b"$-1\r\n")
            elif op == b"LINDEX":
                if served == 2:   # the header and layer 0, then
                    if mode == "close":
                        c.close(); return
                    time.sleep(30); return
                c.sendall(bulk(parts[int(args[2])])); served += 1
            elif op in (b"EVAL", b"EXISTS"):
                c.sendall(b":1\r\n")
            else:
                c.sendall(b"+OK\r\n")
s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(16); s.settimeout(20)
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
    fpid=$!
    i=0; while [ ! -S "$T/fs.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
}
for mode in close hang; do
    rm -rf "$T/fs.sock" "$T/g"; $STORE --store "$T/g" init --tier "main=$T/g/t" > /dev/null 2>&1
    python3 - "$T/a/store.json" "$T/g/store.json" "$T/fs.sock" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); g = json.load(open(sys.argv[2]))
g["shared"] = dict(a["shared"]); g["shared"]["url"] = "unix://" + sys.argv[3]; g["shared"]["timeout_ms"] = 500
json.dump(g, open(sys.argv[2], "w"))
PY
    fake_stream $mode
    t0=$(date +%s)
    run g --no-store-write; rc=$?
    t1=$(date +%s)
    kill "$fpid" 2>/dev/null; wait "$fpid" 2>/dev/null
    [ $rc -eq 0 ] && [ $((t1 - t0)) -le 5 ] && grep -q "shared tier" "$T/err-g" && cmp -s "$T/ans-g" "$T/a-full" \
        && ok "server $( [ $mode = close ] && echo dies || echo hangs ) mid-stream: cb-run answers in $((t1 - t0)) s, warned, equal to full prefill at ratio 1" \
        || { not_ok "server $mode mid-stream (exit $rc, $((t1 - t0)) s)"; sed 's/^/#   /' "$T/err-g" | head -5; }
done
grep -q "timed out" "$T/err-g" && ok "a hung stream is bounded by the time-out" || { not_ok "hung stream warning"; sed 's/^/#   /' "$T/err-g" | head -3; }

# -- capacity: a small shared tier never holds more than its capacity
SZ=$($STORE --store "$T/a" ls --json --tier shared | head -n 1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["bytes"])')
$STORE --store "$T/s" init --tier "main=$T/s/t:1K" --tier "small=unix://$SOCK:$((SZ * 2 + SZ / 2))" > /dev/null 2>&1
"$PRE" -m "$M" --store "$T/s" -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err-s"
SSID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/s/store.json")
used=$($R GET "cb:$SSID:used"); n_small=$($R ZCARD "cb:$SSID:lru")
[ "$used" -le $((SZ * 2 + SZ / 2)) ] && [ "$n_small" -eq 2 ] && ok "capacity: the shared tier keeps the 2 newest ($used bytes)" \
    || not_ok "capacity: $used bytes, $n_small entries"

# -- capacity with concurrent writers: four hosts put at once into a tier of 3 entries
mkdir -p "$T/kvs"
"$STORE" --store "$T/a" ls --tier main | cut -d' ' -f1 | while read -r k; do "$STORE" --store "$T/a" get "$k" -o "$T/kvs/$k.kv"; done
CAP=$((SZ * 3))
for w in 1 2 3 4; do
    $STORE --store "$T/w$w" init --tier "main=$T/w$w/t:1K" --tier "cc=unix://$SOCK:$CAP" > /dev/null 2>&1
done
CSID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/w1/store.json")
wpids=""
for w in 1 2 3 4; do
    ( for r in 1 2 3; do for f in $(ls "$T"/kvs/*.kv | sort -R 2>/dev/null || ls "$T"/kvs/*.kv); do
        $STORE --store "$T/w$w" put "$f" > /dev/null 2>&1; done; done ) &
    wpids="$wpids $!"
done
alive() { for p in $wpids; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
maxu=0; samples=0
while alive && [ $samples -lt 400 ]; do
    u=$($R GET "cb:$CSID:used"); u=${u:-0}; [ "$u" -gt "$maxu" ] && maxu=$u; samples=$((samples + 1))
done
wait
sum=0; n_cc=0
for k in $($R ZRANGE "cb:$CSID:lru" 0 -1); do sum=$((sum + $($R HGET "cb:{$CSID:$k}:m" bytes))); n_cc=$((n_cc + 1)); done
[ "$maxu" -le "$CAP" ] && [ "$($R GET "cb:$CSID:used")" -eq "$sum" ] && [ "$n_cc" -eq 3 ] \
    && ok "four writers at once: never over capacity ($samples samples, at most $maxu of $CAP bytes), $n_cc entries, accounting exact" \
    || not_ok "concurrent capacity: max $maxu of $CAP, used $($R GET "cb:$CSID:used") vs $sum, $n_cc entries"
expect_exit "verify after the concurrent writers" 0 $STORE --store "$T/w1" verify

# -- the server hung (SIGSTOP): every call is bounded by the time-out (500 ms here)
$STORE --store "$T/d" init --tier "main=$T/d/t" 2>/dev/null
python3 - "$T/a/store.json" "$T/d/store.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); d = json.load(open(sys.argv[2]))
d["shared"] = dict(a["shared"]); d["shared"]["timeout_ms"] = 500
json.dump(d, open(sys.argv[2], "w"))
PY
kill -STOP "$(cat "$T/redis.pid")"
t0=$(date +%s)
run d; rc=$?
t1=$(date +%s)
kill -CONT "$(cat "$T/redis.pid")"
[ $rc -eq 0 ] && [ $((t1 - t0)) -le 8 ] && ok "server hung: cb-run answers in $((t1 - t0)) s" \
    || { not_ok "cb-run with the server hung (exit $rc, $((t1 - t0)) s)"; sed 's/^/#   /' "$T/err-d" | head -5; }
cmp -s "$T/ans-d" "$T/a-full" && ok "computed in place, the answer equals full prefill's" || not_ok "d vs full (hung)"
grep -q "shared tier.*[Tt]imed out\|shared tier.*Resource temporarily" "$T/err-d" && ok "it warns of the time-out" \
    || { not_ok "the time-out warning"; sed 's/^/#   /' "$T/err-d" | head -5; }
rm -rf "$T/d/t"/*.kv; $STORE --store "$T/d" verify --repair > /dev/null 2>&1

# -- a server that hangs up mid-put (a fake one: it stops reading after EXISTS, before the upload):
#    the write gets EPIPE, and SIGPIPE must not kill the program
python3 - "$T/fake.sock" > /dev/null 2>&1 <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); s.settimeout(20)
for _ in range(4):
    try:
        c, _ = s.accept()
    except OSError:
        break
    while True:
        d = c.recv(65536)
        if not d:
            break
        if b"EXISTS" in d:
            # no more reading: the client's next write fails with EPIPE, for sure
            c.shutdown(socket.SHUT_RD); c.sendall(b":0\r\n"); break
        c.sendall(b":0\r\n")
PY
fpid=$!
i=0; while [ ! -S "$T/fake.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
$STORE --store "$T/f" init --tier "main=$T/f/t" > /dev/null 2>&1
python3 - "$T/a/store.json" "$T/f/store.json" "$T/fake.sock" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); f = json.load(open(sys.argv[2]))
f["shared"] = dict(a["shared"]); f["shared"]["url"] = "unix://" + sys.argv[3]; f["shared"]["timeout_ms"] = 500
json.dump(f, open(sys.argv[2], "w"))
PY
expect_exit "a put while the server hangs up mid-upload (no SIGPIPE death)" 0 $STORE --store "$T/f" put "$(ls "$T"/kvs/*.kv | head -n 1)"
grep -q "shared tier" "$T/err" && ok "and it warns" || { not_ok "the hang-up warning"; sed 's/^/#   /' "$T/err" | head -3; }
kill "$fpid" 2>/dev/null; wait "$fpid" 2>/dev/null

# -- the server killed: cb-run answers (computed in place); then restarted
redis_kill
t0=$(date +%s)
run d; rc=$?
t1=$(date +%s)
[ $rc -eq 0 ] && [ $((t1 - t0)) -le 10 ] && ok "server down: cb-run answers in $((t1 - t0)) s" \
    || { not_ok "cb-run with the server down (exit $rc, $((t1 - t0)) s)"; sed 's/^/#   /' "$T/err-d" | head -5; }
cmp -s "$T/ans-d" "$T/a-full" && ok "computed in place, the answer equals full prefill's" || not_ok "d vs full"
[ "$(grep -c 'shared tier' "$T/err-d")" -eq 1 ] && ok "it warns once" || { not_ok "warnings: $(grep -c 'shared tier' "$T/err-d")"; sed 's/^/#   /' "$T/err-d" | head -5; }
redis_start && ok "redis restarted" || not_ok "redis restart"
"$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null 2>&1
rm -rf "$T/d/t"/*.kv; $STORE --store "$T/d" verify --repair > /dev/null 2>&1
run d
[ "$(stat_of d n_chunks_missing)" -eq 0 ] && ok "after the restart and a new precompute, d answers from the shared tier" \
    || { not_ok "d after the restart"; sed 's/^/#   /' "$T/err-d" | head -5; }

# -- three hosts at once: precompute, cb-run, gc on each; clients killed at random; one Redis restart
for h in h1 h2 h3; do
    $STORE --store "$T/$h" init --tier "main=$T/$h/t:$((SZ * 3))" --tier "shared=unix://$SOCK:$((SZ * 6))" > /dev/null 2>&1
done
for d in 1 2 3 4 5 6 7 8; do
    printf 'Note %s on the Vale ferry, crossing number %s, in the year 18%s0.\n' $d $d $d > "$T/docs/n$d.txt"
done
"$CHUNK" -m "$M" --tokens 16 "$T/docs" > "$T/more.jsonl"
end=$(( $(date +%s) + 12 ))
killed=0; restarted=0; pids=""
while [ "$(date +%s)" -lt "$end" ]; do
    for h in h1 h2 h3; do
        case $(( $(od -An -N1 -tu1 /dev/urandom) % 3 )) in
        0) "$PRE" -m "$M" --store "$T/$h" -q < "$T/more.jsonl" > /dev/null 2>> "$T/log-$h" & ;;
        1) "$RUN" -m "$M" --store "$T/$h" --chunks "$T/more.jsonl" -n 2 -p "$Q" > /dev/null 2>> "$T/log-$h" & ;;
        2) $STORE --store "$T/$h" gc > /dev/null 2>> "$T/log-$h" & ;;
        esac
        pids="$pids $!"
    done
    sleep 0.$(( $(od -An -N1 -tu1 /dev/urandom) % 5 + 1 ))
    for p in $pids; do
        if [ $(( $(od -An -N1 -tu1 /dev/urandom) % 4 )) -eq 0 ] && kill -9 "$p" 2>/dev/null; then killed=$((killed + 1)); fi
    done
    if [ $restarted -eq 0 ] && [ "$(date +%s)" -ge $((end - 6)) ]; then
        redis_kill; redis_start && restarted=1
    fi
    wait 2>/dev/null; pids=""
done
wait
[ $restarted -eq 1 ] && ok "three hosts: $killed clients killed, one Redis restart" || not_ok "the Redis restart"
for h in h1 h2 h3; do
    $STORE --store "$T/$h" gc > /dev/null 2>&1
    expect_exit "three hosts: verify on $h" 0 $STORE --store "$T/$h" verify
done
bad=$(cat "$T"/log-h* 2>/dev/null | grep -c "does not match\|checksum mismatch")
[ "$bad" -eq 0 ] && ok "no corrupt read" || not_ok "$bad corrupt reads"
for h in h1 h2 h3; do
    "$RUN" -m "$M" --store "$T/$h" --chunks "$T/more.jsonl" --ratio 1 -n 6 -p "$Q" > "$T/m-$h" 2>/dev/null
done
"$RUN" -m "$M" --chunks "$T/more.jsonl" --mode full --no-store-write -n 6 -p "$Q" > "$T/m-full" 2>/dev/null
cmp -s "$T/m-h1" "$T/m-full" && cmp -s "$T/m-h2" "$T/m-full" && cmp -s "$T/m-h3" "$T/m-full" \
    && ok "three hosts: answers at ratio 1 equal full prefill's" || not_ok "three hosts: answers differ from full prefill"
HSID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/h1/store.json")
used=$($R GET "cb:$HSID:used"); sum=0
for k in $($R ZRANGE "cb:$HSID:lru" 0 -1); do sum=$((sum + $($R HGET "cb:{$HSID:$k}:m" bytes))); done
[ "${used:-0}" -eq "$sum" ] && [ "$sum" -le $((SZ * 6)) ] && ok "the shared tier's accounting matches its entries ($sum bytes)" \
    || not_ok "accounting: used $used, entries $sum, capacity $((SZ * 6))"

# -- caches computed after the chunk before them (cb-precompute --context),
# found by a host that has them in the shared tier only (database 2)
$STORE --store "$T/ca" init --tier "main=$T/ca/t" --tier "shared=redis://127.0.0.1:$PORT/2:64M" > /dev/null 2>&1
$STORE --store "$T/cb" init --tier "main=$T/cb/t" --tier "shared=redis://127.0.0.1:$PORT/2:64M" > /dev/null 2>&1
"$PRE" -m "$M" --store "$T/ca" --context -q < "$T/chunks.jsonl" > /dev/null
"$RUN" -m "$M" --store "$T/cb" --chunks "$T/chunks.jsonl" --mode reuse -n 1 -p "$Q" --stats "$T/st-cb.json" \
    > /dev/null 2> "$T/err-cb"
after=$(stat_of cb n_chunks_after 2>/dev/null)
pairs=$(python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(sum(1 for a, b in zip(r, r[1:]) if a["doc"] == b["doc"] and b["seq"] == a["seq"] + 1))' "$T/chunks.jsonl")
[ "$pairs" -gt 0 ] && [ "${after:-0}" -eq "$pairs" ] && [ "$(stat_of cb n_chunks_missing)" -eq 0 ] \
    && ok "--context: a host with an empty local store uses the $pairs caches after the chunk before them" \
    || { not_ok "--context over the shared tier: $after of $pairs"; sed 's/^/#   /' "$T/err-cb" | head -3; }
done_testing
