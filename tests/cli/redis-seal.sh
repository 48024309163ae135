#!/bin/sh
# The shared tier sealed by a tier key (cb-store(5), SHARED TIER and
# SECURITY): with a real redis-server on a unix socket in the test's
# directory, the server's bytes (its RDB file, uncompressed) hold none of
# a chunk's token ids and none of its KV values once a keyed host wrote it,
# where a host without the key leaves both in clear (the check can fail);
# the entry decrypts, as cb-store(5) describes the construction, to the very
# KV file a local store holds; a changed ciphertext byte is refused by its
# tag and the chunk computed; an entry of the previous format (GMAC tags,
# parts in clear) is read and rewritten sealed, by a streaming reader and by
# a whole fetch; a host without the key reads nothing and drops nothing; a
# wrong key reads nothing.  Skips where redis-server or python3's
# cryptography is missing.
. "$(dirname "$0")/lib.sh"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -z "$RS" ] || [ -z "$RC" ] || [ ! -f "$M" ] || ! python3 -c 'import cryptography' 2> /dev/null; then
    skip "the shared tier sealed" "no redis-server/redis-cli/python3 with cryptography (make deps) or no $M"
    done_testing; exit 0
fi
umask 077
redis_start --rdbcompression no --dbfilename dump.rdb
radm() { "$RC" -s "$SOCK" "$@"; }
if ! radm ping 2>/dev/null | grep -q PONG; then
    skip "the shared tier sealed" "redis-server does not start here ($(tail -n 2 "$T/redis.log" 2>/dev/null))"
    done_testing; exit 0
fi
URL="unix://$SOCK:64M"
$STORE keygen "$T/tier.key" > /dev/null 2>&1 && $STORE keygen "$T/other.key" > /dev/null 2>&1 || not_ok "keygen"

# py CMD ARGS: the helper below (raw Redis commands, binary-safe; the construction of cb-store(5))
py() {
    python3 - "$SOCK" "$@" <<'PY'
import ctypes, glob, os, socket, struct, sys
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
def cmd(*a):
    a = [x if isinstance(x, bytes) else str(x).encode() for x in a]
    s.sendall(b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x), x) for x in a]))
    l = f.readline()
    if l[:1] == b"$":
        n = int(l[1:]); return None if n < 0 else f.read(n + 2)[:-2]
    assert l[:1] in b"+:", l
    return l[1:].strip()
def ku(K, ver, sid, key, nonce):
    return HKDFExpand(hashes.SHA256(), 32, b"cacheblend-entry-key-%s\0" % ver + sid + key + nonce).derive(K)
def aad(ver, sid, key, nonce, i, n, total, ln):
    return b"cacheblend-part-%s\0" % ver + sid + key + nonce + struct.pack("<QQQQ", i, n, total, ln)
def parts(kv):  # a KV file as the writer splits it: the header, then one part per layer
    H, = struct.unpack_from("<I", kv, 12); L, = struct.unpack_from("<I", kv, 48); S, = struct.unpack_from("<Q", kv, 96)
    return [kv[:H]] + [kv[H + l * S:H + (l + 1) * S] for l in range(L)]
class X128(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64)]
x = ctypes.CDLL("libxxhash.so.0"); x.XXH3_128bits.restype = X128
x.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def xxh128(b):
    h = x.XXH3_128bits(b, len(b)); return "%016x%016x" % (h.hi, h.lo)
a = sys.argv[2:]
if a[0] == "needles":     # KVDIR OUT: every 3 consecutive token ids (int32 LE) and 4 consecutive f16 values
    out = []              # taken from each layer's K and V of each file, one hex needle a line
    for p in sorted(glob.glob(a[1] + "/*.kv")):
        kv = open(p, "rb").read()
        n, = struct.unpack_from("<I", kv, 76); typ, = struct.unpack_from("<I", kv, 72)
        assert typ == 1, typ  # f16
        ids = kv[128:128 + 4 * n]
        out += ["t " + ids[4 * i:4 * i + 12].hex() for i in range(n - 2)]
        H, = struct.unpack_from("<I", kv, 12); L, = struct.unpack_from("<I", kv, 48)
        S, B = struct.unpack_from("<QQ", kv, 96)
        for l in range(L):
            for k in range(8):   # 8 runs of 4 values spread over K and V
                o = H + l * S + k * (2 * B // 8) // 8 * 8
                run = kv[o:o + 8]
                if len(set(run)) > 2:
                    out.append("v " + run.hex())
    open(a[2], "w").write("\n".join(out) + "\n")
elif a[0] == "find":      # NEEDLES FILE: how many token and KV needles FILE holds
    hay = open(a[2], "rb").read(); t = v = 0
    for line in open(a[1]):
        kind, h = line.split()
        if bytes.fromhex(h) in hay:
            t += kind == "t"; v += kind == "v"
    print(t, v)
elif a[0] == "open":      # KEYFILE SID KEY OUT: the entry decrypted as cb-store(5) says, written to OUT
    K, sid, key = bytes.fromhex(open(a[1]).read().strip()), a[2].encode(), a[3].encode()
    mk, vk = b"cb:{%s:%s}:m" % (sid, key), b"cb:{%s:%s}:v" % (sid, key)
    assert cmd("HGET", mk, "mac_alg") == b"aes-256-gcm-v3"
    n, total = int(cmd("HGET", mk, "parts")), int(cmd("HGET", mk, "bytes"))
    nonce, tags = bytes.fromhex(cmd("HGET", mk, "mac_nonce").decode()), bytes.fromhex(cmd("HGET", mk, "macs").decode())
    g = AESGCM(ku(K, b"v3", sid, key, nonce)); out = b""; stored = b""
    for i in range(n):
        c = cmd("LINDEX", vk, i); stored += c
        out += g.decrypt(struct.pack("<Q", i) + bytes(4), c + tags[16 * i:16 * i + 16], aad(b"v3", sid, key, nonce, i, n, total, len(c)))
    assert cmd("HGET", mk, "checksum").decode() == xxh128(stored), "the checksum is not the ciphertext's"
    open(a[4], "wb").write(out)
elif a[0] == "v2":        # KEYFILE SID KEY KVFILE [bad]: the entry replaced by one of the previous format (bad: part 1's tag wrong)
    K, sid, key = bytes.fromhex(open(a[1]).read().strip()), a[2].encode(), a[3].encode()
    mk, vk = b"cb:{%s:%s}:m" % (sid, key), b"cb:{%s:%s}:v" % (sid, key)
    kv = open(a[4], "rb").read(); ps = parts(kv); n, nonce = len(ps), os.urandom(16)
    g = AESGCM(ku(K, b"v2", sid, key, nonce))  # GMAC: GCM with no plaintext, the input as AAD
    tags = b"".join(g.encrypt(struct.pack("<Q", i) + bytes(4), b"", aad(b"v2", sid, key, nonce, i, n, len(kv), len(p)) + p)
                    for i, p in enumerate(ps))
    if a[5:] == ["bad"]:
        tags = tags[:16] + bytes([tags[16] ^ 1]) + tags[17:]
    cmd("DEL", vk)
    for p in ps:
        cmd("RPUSH", vk, p)
    cmd("HSET", mk, "bytes", len(kv), "parts", n, "checksum", xxh128(kv), "mac_nonce", nonce.hex(), "macs", tags.hex(),
        "mac_alg", "aes-256-gmac-v2")
elif a[0] == "flip":      # LIST I BYTE: one bit of part I changed
    p = bytearray(cmd("LINDEX", a[1], a[2])); p[int(a[3])] ^= 0x10; cmd("LSET", a[1], a[2], bytes(p))
PY
}
dump() { radm SAVE > /dev/null && cp "$T/dump.rdb" "$T/$1.rdb"; }
vale_chunks "$M" "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
# run STORE OUT [ARGS]: cb-run --mode reuse (the caches as they are) on STORE, its stats in st-OUT.json
run() { h=$1; o=$2; shift 2; "$RUN" -m "$M" --store "$T/$h" --chunks "$T/chunks.jsonl" --mode reuse -n 1 -p "$Q" \
    --logits-out "$T/lg-$o" --stats "$T/st-$o.json" "$@" > /dev/null 2> "$T/err-$o"; }
stat_of() { f=$1; shift; python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[k]
print(d)' "$T/st-$f.json" "$@"; }
# fresh NAME [KEYFILE]: a host with an empty local tier, on the shared tier, with KEYFILE (none: no key)
fresh() { rm -rf "$T/$1"; $STORE --store "$T/$1" init --tier "main=$T/$1/t" --tier "shared=$URL" ${2:+--key-file "$2"} \
    > /dev/null 2>> "$T/all-err"; }

# -- the chunks in clear: a local store, and the needles taken from its files
$STORE --store "$T/loc" init --tier "main=$T/loc/t" > /dev/null 2>&1
"$PRE" -m "$M" --store "$T/loc" -q < "$T/chunks.jsonl" > /dev/null 2>> "$T/all-err" || not_ok "cb-precompute, local"
mkdir -p "$T/kvs"
for k in $($STORE --store "$T/loc" ls --tier main | cut -d' ' -f1); do
    $STORE --store "$T/loc" get "$k" -o "$T/kvs/$k.kv" > /dev/null 2>&1
done
nkv=$(ls "$T/kvs" | wc -l)
py needles "$T/kvs" "$T/needles" && nt=$(grep -c '^t' "$T/needles") && nv=$(grep -c '^v' "$T/needles") \
    && [ "$nkv" -gt 2 ] && [ "$nt" -gt 10 ] && [ "$nv" -gt 10 ] \
    && ok "$nkv chunks precomputed locally: $nt runs of 3 token ids and $nv runs of 4 f16 KV values to look for" \
    || { not_ok "needles ($nkv files)"; done_testing; exit 1; }
run loc ref
# (a store that does not exist, not $CB_STORE's or the default one, which may hold these chunks)
"$RUN" -m "$M" --store "$T/nostore" --chunks "$T/chunks.jsonl" --mode reuse -n 1 -p "$Q" --no-store-write \
    --logits-out "$T/lg-none" > /dev/null 2>> "$T/all-err"
[ -s "$T/lg-ref" ] && [ -s "$T/lg-none" ] && ! cmp -s "$T/lg-ref" "$T/lg-none" \
    && ok "references: the answer from the local store's caches, and with every chunk computed (they differ)" \
    || not_ok "the reference runs"

# -- the control: a host without the key writes them in clear, and the server's bytes show them
fresh plain
"$PRE" -m "$M" --store "$T/plain" -q < "$T/chunks.jsonl" > /dev/null 2>> "$T/all-err"
dump plain
set -- $(py find "$T/needles" "$T/plain.rdb")
[ "$1" -eq "$nt" ] && [ "$2" -eq "$nv" ] \
    && ok "without a tier key the server's RDB file holds every token run ($1 of $nt) and KV run ($2 of $nv)" \
    || not_ok "control: $1 of $nt token runs, $2 of $nv KV runs found in clear"
radm FLUSHALL > /dev/null

# -- a keyed host writes them sealed
fresh w "$T/tier.key"
"$PRE" -m "$M" --store "$T/w" -q < "$T/chunks.jsonl" > /dev/null 2>> "$T/all-err" || not_ok "cb-precompute, keyed"
SID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/w/store.json")
nkeys=$(radm ZCARD "cb:$SID:lru")
K=$(radm ZRANGE "cb:$SID:lru" 0 0)
MK="cb:{$SID:$K}:m" VK="cb:{$SID:$K}:v"
[ "$nkeys" -eq "$nkv" ] && [ "$(radm HGET "$MK" mac_alg)" = aes-256-gcm-v3 ] \
    && [ "$(radm HSTRLEN "$MK" macs)" -eq $((32 * $(radm HGET "$MK" parts))) ] \
    && ok "$nkeys entries in the shared tier, mac_alg aes-256-gcm-v3, a 16-byte tag per part" \
    || not_ok "the sealed entries ($nkeys of $nkv; mac_alg $(radm HGET "$MK" mac_alg))"
dump sealed
set -- $(py find "$T/needles" "$T/sealed.rdb")
[ "$1" -eq 0 ] && [ "$2" -eq 0 ] && [ "$(stat -c %s "$T/sealed.rdb")" -gt "$(du -cb "$T"/kvs/*.kv | tail -n 1 | cut -f1)" ] \
    && ok "with the key the server's RDB file (uncompressed, as large as the entries) holds no token run and no KV run" \
    || not_ok "sealed: $1 token runs, $2 KV runs found in clear"
py open "$T/tier.key" "$SID" "$K" "$T/opened.kv" 2> "$T/err-open" && cmp -s "$T/opened.kv" "$T/kvs/$K.kv" \
    && ok "the entry decrypts, as cb-store(5) gives the construction, to the local store's KV file; its checksum is the ciphertext's" \
    || { not_ok "decrypting as cb-store(5) says"; sed 's/^/#   /' "$T/err-open" | tail -n 2; }

# -- keyed readers: streamed (the default) and fetched whole, the same answer as the local store's
fresh q "$T/tier.key"; run q stream --no-store-write
[ "$(stat_of stream n_chunks_missing)" -eq 0 ] && [ "$(stat_of stream shared n_refused)" -eq 0 ] && cmp -s "$T/lg-stream" "$T/lg-ref" \
    && [ ! -s "$T/err-stream" ] && ok "a keyed reader streams and decrypts every chunk: the local store's answer, quietly" \
    || { not_ok "streamed read"; sed 's/^/#   /' "$T/err-stream" | head -3; }
fresh q2 "$T/tier.key"; CB_STORE_STREAM=0 run q2 whole --no-store-write
[ "$(stat_of whole n_chunks_missing)" -eq 0 ] && cmp -s "$T/lg-whole" "$T/lg-ref" && [ ! -s "$T/err-whole" ] \
    && ok "fetched whole (\$CB_STORE_STREAM=0): every chunk, the same answer" || { not_ok "whole read"; sed 's/^/#   /' "$T/err-whole" | head -3; }
$STORE --store "$T/w" verify > "$T/out" 2> "$T/err"; rc=$?
[ $rc -eq 0 ] && ok "verify on the keyed host (every entry fetched, decrypted, checked) is clean" || { not_ok "verify (exit $rc)"; sed 's/^/#   /' "$T/out" | head -3; }

# -- a ciphertext byte changed: refused by its tag, the chunk computed
py flip "$VK" 1 100
fresh qa "$T/tier.key"; run qa flip --no-store-write; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of flip shared n_refused)" -eq 1 ] && [ "$(stat_of flip n_chunks_missing)" -eq 1 ] \
    && grep -q "part 1: its MAC does not verify" "$T/err-flip" && [ "$(radm EXISTS "$MK")" -eq 0 ] \
    && ok "one bit of a sealed layer changed: refused by its tag (n_refused 1), dropped, the chunk computed" \
    || { not_ok "a changed ciphertext byte (exit $rc)"; sed 's/^/#   /' "$T/err-flip" | head -3; }
$STORE --store "$T/w" rm "$K" > /dev/null 2>&1; $STORE --store "$T/w" put "$T/kvs/$K.kv" > /dev/null 2>> "$T/all-err"

# -- an entry of the previous format (aes-256-gmac-v2: GMAC tags, parts in clear)
v2_entry() { py v2 "$T/tier.key" "$SID" "$K" "$T/kvs/$K.kv" $1 && [ "$(radm HGET "$MK" mac_alg)" = aes-256-gmac-v2 ] \
    && dump v2 && set -- $(py find "$T/needles" "$T/v2.rdb") && [ "$1" -gt 0 ]; }
v2_entry && ok "an entry rewritten in the previous format: GMAC tags, its token ids in clear on the server" || not_ok "the v2 entry"
fresh qv "$T/tier.key"; run qv v2s; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of v2s n_chunks_missing)" -eq 0 ] && [ "$(stat_of v2s shared n_refused)" -eq 0 ] \
    && [ "$(stat_of v2s shared n_resealed)" -eq 1 ] && cmp -s "$T/lg-v2s" "$T/lg-ref" && [ "$(radm HGET "$MK" mac_alg)" = aes-256-gcm-v3 ] \
    && ok "a streaming reader reads it (tags checked), and rewrites it sealed (n_resealed 1, mac_alg aes-256-gcm-v3)" \
    || { not_ok "the v2 entry streamed (exit $rc, resealed $(stat_of v2s shared n_resealed))"; sed 's/^/#   /' "$T/err-v2s" | head -3; }
v2_entry || not_ok "the v2 entry again"
fresh qw "$T/tier.key"; CB_STORE_STREAM=0 run qw v2w; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of v2w n_chunks_missing)" -eq 0 ] && [ "$(stat_of v2w shared n_resealed)" -eq 1 ] \
    && cmp -s "$T/lg-v2w" "$T/lg-ref" && [ "$(radm HGET "$MK" mac_alg)" = aes-256-gcm-v3 ] \
    && ok "fetched whole: read, and rewritten sealed" || { not_ok "the v2 entry fetched whole (exit $rc)"; sed 's/^/#   /' "$T/err-v2w" | head -3; }
dump resealed
set -- $(py find "$T/needles" "$T/resealed.rdb")
[ "$1" -eq 0 ] && [ "$2" -eq 0 ] && py open "$T/tier.key" "$SID" "$K" "$T/opened2.kv" && cmp -s "$T/opened2.kv" "$T/kvs/$K.kv" \
    && ok "after the rewrite the server's bytes hold no token or KV run again, and the entry decrypts to the KV file" \
    || not_ok "after the rewrite: $1 token runs, $2 KV runs in clear"
v2_entry bad || not_ok "the v2 entry once more"
fresh qx "$T/tier.key"; run qx v2bad --no-store-write; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of v2bad shared n_refused)" -eq 1 ] && [ "$(stat_of v2bad shared n_resealed)" -eq 0 ] \
    && grep -q "part 1: its MAC does not verify" "$T/err-v2bad" \
    && ok "a previous-format entry whose tag does not verify is refused, not rewritten" \
    || { not_ok "a bad v2 entry (exit $rc)"; sed 's/^/#   /' "$T/err-v2bad" | head -3; }
$STORE --store "$T/w" rm "$K" > /dev/null 2>&1; $STORE --store "$T/w" put "$T/kvs/$K.kv" > /dev/null 2>> "$T/all-err"

# -- no key: reads nothing, drops nothing, said once
fresh nokey; run nokey nokey --no-store-write; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of nokey n_chunks_missing)" -eq "$(stat_of nokey n_chunks)" ] && [ "$(radm ZCARD "cb:$SID:lru")" -eq "$nkeys" ] \
    && [ "$(grep -c "sealed (aes-256-gcm-v3) and this host has no tier key" "$T/err-nokey")" -eq 1 ] && cmp -s "$T/lg-nokey" "$T/lg-none" \
    && ok "a host without the key: every chunk computed, every entry left in place, warned once" \
    || { not_ok "the keyless host (exit $rc)"; sed 's/^/#   /' "$T/err-nokey" | head -3; }
"$PRE" -m "$M" --store "$T/nokey" -q < "$T/chunks.jsonl" > /dev/null 2>> "$T/all-err"
[ "$(radm HGET "$MK" mac_alg)" = aes-256-gcm-v3 ] && ok "its puts leave the sealed entries alone" || not_ok "a keyless put replaced a sealed entry"

# -- a wrong key: reads nothing (and drops what it refuses, as for any foreign entry)
fresh wrong "$T/other.key"; run wrong wrong --no-store-write; rc=$?
[ $rc -eq 0 ] && [ "$(stat_of wrong n_chunks_missing)" -eq "$(stat_of wrong n_chunks)" ] && [ "$(stat_of wrong shared n_refused)" -eq "$nkeys" ] \
    && grep -q "another tier key" "$T/err-wrong" && cmp -s "$T/lg-wrong" "$T/lg-none" \
    && ok "a wrong tier key reads nothing: $nkeys entries refused, every chunk computed" \
    || { not_ok "the wrong key (exit $rc)"; sed 's/^/#   /' "$T/err-wrong" | head -3; }
grep -qF "$(cat "$T/tier.key")" "$T"/err* "$T/all-err" "$T"/*/store.json 2>/dev/null && not_ok "the tier key in a message" \
    || ok "the tier key in no message and no store.json"
done_testing
