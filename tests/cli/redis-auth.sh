#!/bin/sh
# The shared tier secured (issue 35), with a real redis-server started here
# on a unix socket in the test's directory, with requirepass and the two ACL
# users of cb-store(5): logins refused and accepted, a read-only user that
# reads but cannot write, secret files checked like ssh's keys, entries
# authenticated by a tier key against an attacker who can write to Redis
# (thirteen ways of planting or changing an entry: forged values, another
# key's MACs, parts moved, nonce, count, size or a bit changed, tags or
# algorithm missing or unknown, an older host's HMAC-SHA256 entry), the
# secrets never in store.json, ps or
# a message, and the tunnel of cb-store(5) through stunnel (skipped where
# stunnel is missing).  Skips where redis-server is missing.
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -z "$RS" ] || [ -z "$RC" ] || [ ! -f "$M" ] || ! command -v python3 > /dev/null; then
    skip "the shared tier secured" "no redis-server/redis-cli/python3 (make deps) or no $M"
    done_testing; exit 0
fi
# The passwords: random, so that a grep for them finds nothing by chance.
rnd() { od -An -N12 -tx1 /dev/urandom | tr -d ' \n'; }
ADMIN=adm$(rnd) CRON=cron$(rnd) QUERY=qry$(rnd)
umask 077
# The ACL lines exactly as cb-store(5) gives them (ACL SETUSER ... there, `user` lines in a config).
acl() { sed -n "/^\.\\\\\" acl-$1\$/,/^\.\\\\\" end/p" "$(dirname "$0")/../../man/man5/cb-store.5" | grep '^ACL SETUSER' | sed 's/^ACL SETUSER /user /'; }
{
    echo "requirepass $ADMIN"
    acl cron | sed "s/PASSWORD/$CRON/"; acl query | sed "s/PASSWORD/$QUERY/"
} > "$T/redis.conf"
[ "$(grep -c '^user cb-' "$T/redis.conf")" -eq 2 ] || { not_ok "the ACL lines of cb-store(5) (found $(grep -c '^user cb-' "$T/redis.conf"))"; done_testing; exit 1; }
redis_start "$T/redis.conf"
trap 'redis_stop; [ -n "${tpids:-}" ] && kill $tpids 2>/dev/null; rm -rf "$T"' EXIT
if ! REDISCLI_AUTH=$ADMIN "$RC" --no-auth-warning -s "$SOCK" ping 2>/dev/null | grep -q PONG; then
    skip "the shared tier secured" "redis-server does not start here ($(tail -n 2 "$T/redis.log" 2>/dev/null))"
    done_testing; exit 0
fi
ok "redis-server with requirepass and the ACL users cb-cron and cb-query of cb-store(5)"
# r USER PASS CMD...: a command as that user (the password through the environment, never argv)
r() { u=$1; p=$2; shift 2; REDISCLI_AUTH=$p "$RC" --no-auth-warning --user "$u" -s "$SOCK" "$@"; }
radm() { REDISCLI_AUTH=$ADMIN "$RC" --no-auth-warning -s "$SOCK" "$@"; }
printf 'cb-cron %s\n' "$CRON" > "$T/cron.auth"
printf 'cb-query %s\n' "$QUERY" > "$T/query.auth"
printf 'cb-cron not%s\n' "$CRON" > "$T/wrong.auth"
chmod 600 "$T"/*.auth
URL="unix://$SOCK:64M"

# -- the tier key
expect_exit "keygen makes a tier key" 0 $STORE keygen "$T/tier.key"
[ "$(stat -c %a "$T/tier.key")" = 600 ] && grep -qE '^[0-9a-f]{64}$' "$T/tier.key" \
    && ok "the key file: mode 600, 64 hexadecimal digits" || not_ok "the key file: $(stat -c %a "$T/tier.key")"
expect_exit "keygen never overwrites a key" 73 $STORE keygen "$T/tier.key"
$STORE keygen "$T/other.key" > /dev/null 2>&1

# -- logins
expect_exit "init: no password: refused" 74 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=$URL"
grep -q "NOAUTH.*--auth-file" "$T/err" && ok "it says the server wants a password, and how to give one" || not_ok "NOAUTH message: $(cat "$T/err")"
cat "$T/err" >> "$T/all-err"
expect_exit "init: a wrong password: refused" 74 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=$URL" --auth-file "$T/wrong.auth"
grep -q "refused the login of user cb-cron" "$T/err" && ok "it says the login was refused" || not_ok "WRONGPASS message: $(cat "$T/err")"
cat "$T/err" >> "$T/all-err"
chmod 644 "$T/cron.auth"
expect_exit "init: a password file others may read: refused" 65 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=$URL" --auth-file "$T/cron.auth"
grep -q "too open" "$T/err" && ok "it says the permissions are too open" || not_ok "mode message: $(cat "$T/err")"
cat "$T/err" >> "$T/all-err"
chmod 600 "$T/cron.auth"
expect_exit "init: a missing password file" 66 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=$URL" --auth-file "$T/none.auth"
expect_exit "init: the read-only user cannot make the tier" 74 $STORE --store "$T/x" init --tier "main=$T/x/t" --tier "shared=$URL" --auth-file "$T/query.auth"
grep -q "does not exist yet.*cb-query may not make it" "$T/err" && ok "it says so" || not_ok "read-only init message: $(cat "$T/err")"
cat "$T/err" >> "$T/all-err"
[ ! -e "$T/x/store.json" ] && ok "no store is left behind by a refused init" || not_ok "a store was made"
expect_exit "init: the cron host (read/write user, tier key)" 0 $STORE --store "$T/cron" init --tier "main=$T/cron/t" --tier "shared=$URL" \
    --auth-file "$T/cron.auth" --key-file "$T/tier.key"
expect_exit "init: a query host (read-only user, tier key)" 0 $STORE --store "$T/q" init --tier "main=$T/q/t" --tier "shared=$URL" \
    --auth-file "$T/query.auth" --key-file "$T/tier.key"
python3 - "$T/cron/store.json" "$T/cron.auth" "$T/tier.key" <<'PY' && ok "store.json records the secret files' names" || not_ok "store.json secrets"
import json, sys
s = json.load(open(sys.argv[1]))["shared"]
assert s["auth_file"] == sys.argv[2] and s["key_file"] == sys.argv[3], s
PY
$STORE --store "$T/q" stat > "$T/stat-q" 2>> "$T/all-err"
grep -q "login with a password as user cb-query" "$T/stat-q" && grep -q "authenticated: .*tier key [0-9a-f]\{16\}" "$T/stat-q" \
    && ok "stat: the login and the tier key's id" || { not_ok "stat"; sed 's/^/#   /' "$T/stat-q"; }

# -- the cron host writes (with MACs), the query host reads
vale_chunks "$M" "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
# ps while our programs run: every process' command line, sampled until $1 is gone
watch_ps() { while kill -0 "$1" 2>/dev/null; do ps -eo args >> "$T/ps.log" 2>/dev/null; sleep 0.02; done; }
"$PRE" -m "$M" --store "$T/cron" -q < "$T/chunks.jsonl" > /dev/null 2> "$T/err-pre" & p=$!; watch_ps $p; wait $p \
    && ok "cb-precompute on the cron host" || { not_ok "cb-precompute on the cron host"; sed 's/^/#   /' "$T/err-pre" | head -3; }
SID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/cron/store.json")
nkeys=$(radm ZCARD "cb:$SID:lru")
K=$(radm ZRANGE "cb:$SID:lru" 0 0)
[ "$nkeys" -gt 2 ] && [ "$(radm HGET "cb:{$SID:$K}:m" mac_key)" = "$($STORE --store "$T/q" stat --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["shared_auth"]["key_id"])')" ] \
    && [ "$(radm HSTRLEN "cb:{$SID:$K}:m" macs)" -eq $((32 * $(radm HGET "cb:{$SID:$K}:m" parts))) ] \
    && [ "$(radm HGET "cb:{$SID:$K}:m" mac_alg)" = aes-256-gcm-v3 ] \
    && ok "$nkeys entries in the shared tier, each sealed, an AES-256-GCM tag per part (mac_alg aes-256-gcm-v3)" \
    || not_ok "the entries' MACs ($nkeys entries)"
# run STORE OUT [ARGS]: cb-run --mode reuse (the caches used as they are: a forged value shows) on STORE
run() { h=$1; o=$2; shift 2; "$RUN" -m "$M" --store "$T/$h" --chunks "$T/chunks.jsonl" --mode reuse -n 1 -p "$Q" \
    --no-store-write --logits-out "$T/lg-$o" --stats "$T/st-$o.json" "$@" > /dev/null 2> "$T/err-$o" & p=$!; watch_ps $p; wait $p
    rc=$?; cat "$T/err-$o" >> "$T/all-err"; return $rc; }
stat_of() { f=$1; shift; python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[k]
print(d)' "$T/st-$f.json" "$@"; }
run q legit
[ "$(stat_of legit n_chunks_missing)" -eq 0 ] && [ "$(stat_of legit shared authenticated)" = True ] && [ "$(stat_of legit shared n_refused)" -eq 0 ] \
    && [ ! -s "$T/err-legit" ] && ok "the read-only user reads every chunk from the shared tier, quietly, its MACs verified" \
    || { not_ok "the query host reads"; sed 's/^/#   /' "$T/err-legit" | head -3; }

# -- the read-only user cannot write
printf 'A new note. The ferry crosses the Vale at dawn.\n' > "$T/docs2.txt"
"$CHUNK" -m "$M" --tokens 24 "$T/docs2.txt" > "$T/new.jsonl"
"$PRE" -m "$M" --store "$T/q" < "$T/new.jsonl" > /dev/null 2> "$T/err-qpre"; rc=$?; cat "$T/err-qpre" >> "$T/all-err"
NK=$($STORE --store "$T/q" ls --tier main --json | python3 -c 'import json,sys; print([json.loads(l)["key"] for l in sys.stdin][0])' 2>/dev/null)
[ $rc -eq 0 ] && [ -n "$NK" ] && [ "$(radm EXISTS "cb:{$SID:$NK}:m")" -eq 0 ] && [ "$(grep -c "user cb-query may not write" "$T/err-qpre")" -eq 1 ] \
    && ok "the read-only user's put stays local: nothing written to Redis, said once" || { not_ok "read-only put (exit $rc)"; sed 's/^/#   /' "$T/err-qpre" | head -3; }
r cb-query "$QUERY" RPUSH "cb:{$SID:$NK}:v" x 2>&1 | grep -q NOPERM && r cb-query "$QUERY" FLUSHALL 2>&1 | grep -q NOPERM \
    && ok "the server refuses that user RPUSH and FLUSHALL (NOPERM)" || not_ok "the read-only ACL lets writes through"
r cb-cron "$CRON" FLUSHALL 2>&1 | grep -q NOPERM && r cb-cron "$CRON" CONFIG GET requirepass 2>&1 | grep -q NOPERM \
    && ok "the cron user may not FLUSHALL or read the configuration" || not_ok "the cron ACL is too wide"

# -- a wrong password on a query host: a warning and a miss, the answer still right
"$RUN" -m "$M" --store "$T/nostore" --chunks "$T/chunks.jsonl" --mode reuse -n 1 -p "$Q" --no-store-write \
    --logits-out "$T/lg-none" > /dev/null 2>> "$T/all-err"   # no store at all: every chunk computed
rm -rf "$T/e"; $STORE --store "$T/e" init --tier "main=$T/e/t" --tier "shared=$URL" --auth-file "$T/query.auth" --key-file "$T/tier.key" > /dev/null 2>&1
CB_REDIS_AUTH_FILE=$T/wrong.auth run e wrongpw; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "refused the login" "$T/err-wrongpw")" -eq 1 ] && [ "$(stat_of wrongpw n_chunks_missing)" -eq "$(stat_of wrongpw n_chunks)" ] \
    && ok "\$CB_REDIS_AUTH_FILE with a wrong password: one warning, every chunk computed" || { not_ok "wrong password on cb-run (exit $rc)"; sed 's/^/#   /' "$T/err-wrongpw" | head -3; }
chmod 640 "$T/query.auth"; run e openpw; rc=$?; chmod 600 "$T/query.auth"
[ $rc -eq 0 ] && grep -q "too open.*it is not used" "$T/err-openpw" && [ "$(stat_of openpw n_chunks_missing)" -eq "$(stat_of openpw n_chunks)" ] \
    && ok "a password file others may read: the tier is not used, with a warning" || { not_ok "open password file on cb-run"; sed 's/^/#   /' "$T/err-openpw" | head -3; }

# -- the attacker: can write to Redis (the cron user's rights), has no tier key
#    Reference: the answer with chunk K computed and every other chunk from its cache.
$STORE --store "$T/cron" get "$K" -o "$T/k.kv" > /dev/null 2>&1
mkdir -p "$T/kvs"
for k in $($STORE --store "$T/cron" ls --tier main | cut -d' ' -f1); do
    [ "$k" = "$K" ] || $STORE --store "$T/cron" get "$k" -o "$T/kvs/$k.kv" > /dev/null 2>&1
done
$STORE --store "$T/ref" init --tier "main=$T/ref/t" > /dev/null 2>&1 && $STORE --store "$T/ref" put "$T"/kvs/*.kv > /dev/null 2>&1
run ref ref
[ "$(stat_of ref n_chunks_missing)" -ge 1 ] && ! cmp -s "$T/lg-ref" "$T/lg-legit" && ok "reference: K computed, the rest cached" \
    || not_ok "the reference run ($(stat_of ref n_chunks_missing) missing)"
# The forged entry: K's own file with every layer's V negated, its layer and header checksums made
# right again (XXH3-64, as cbkv(5) says): a well-formed KV file for K that no verification refuses.
python3 - "$T/k.kv" "$T/forged.kv" <<'PY' && ok "a forged KV file for K with valid checksums" || not_ok "forging"
import ctypes, struct, sys
x = ctypes.CDLL("libxxhash.so.0"); x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
d = bytearray(open(sys.argv[1], "rb").read())
H, = struct.unpack_from("<I", d, 12); L, = struct.unpack_from("<I", d, 48); typ, = struct.unpack_from("<I", d, 72)
n, = struct.unpack_from("<I", d, 76); m, = struct.unpack_from("<I", d, 84)
S, B = struct.unpack_from("<QQ", d, 96)
assert typ == 1  # f16: the sign bit of each element is its top bit
sums = 128 + 4 * (n + m)
for l in range(L):
    o = H + l * S
    for i in range(o + B + 1, o + 2 * B, 2):
        d[i] ^= 0x80
    struct.pack_into("<Q", d, sums + 8 * l, x.XXH3_64bits(bytes(d[o:o + S]), S))
struct.pack_into("<Q", d, 120, 0)
struct.pack_into("<Q", d, 120, x.XXH3_64bits(bytes(d[:H]), H))
open(sys.argv[2], "wb").write(d)
PY
$STORE --store "$T/v" init --tier "main=$T/v/t" > /dev/null 2>&1
$STORE --store "$T/v" put "$T/forged.kv" > "$T/fk" 2>> "$T/all-err" && [ "$(cat "$T/fk")" = "$K" ] \
    && ok "cb-store put takes the forged file as K: its checksums are valid" || not_ok "the forged file is refused locally"
# stores of the attacker: the cron user's password, no key (atk) or a key of its own (atk2)
$STORE --store "$T/atk" init --tier "main=$T/atk/t" --tier "shared=$URL" --auth-file "$T/cron.auth" > /dev/null 2>> "$T/all-err"
$STORE --store "$T/atk2" init --tier "main=$T/atk2/t" --tier "shared=$URL" --auth-file "$T/cron.auth" --key-file "$T/other.key" > /dev/null 2>> "$T/all-err"
# a reader without the key (as every host was before issue 35), which the forged entry fools
$STORE --store "$T/nokey" init --tier "main=$T/nokey/t" --tier "shared=$URL" --auth-file "$T/query.auth" > /dev/null 2>> "$T/all-err"
MK="cb:{$SID:$K}:m" VK="cb:{$SID:$K}:v"
legit_macs() { for f in mac_key mac_nonce macs mac_alg; do r cb-cron "$CRON" HGET "$MK" $f; done > "$T/legit-mac"; }
legit_macs
restore() {   # K legitimate again, as the cron host writes it
    r cb-cron "$CRON" DEL "$MK" "$VK" > /dev/null
    $STORE --store "$T/cron" rm "$K" > /dev/null 2>&1; $STORE --store "$T/cron" put "$T/k.kv" > /dev/null 2>> "$T/all-err"
}
plant() {   # the forged entry written by a store of the attacker's ($1), over the legitimate one
    r cb-cron "$CRON" DEL "$MK" "$VK" > /dev/null
    $STORE --store "$T/$1" rm "$K" > /dev/null 2>&1
    $STORE --store "$T/$1" put "$T/forged.kv" > /dev/null 2>> "$T/all-err"
}
# rawcmd swap|copy|flip|cut|grow|v1 ...: the attacker rewrites parts in place (binary-safe; as Redis' admin)
rawcmd() {
    RPASS=$ADMIN python3 - "$SOCK" "$@" <<'PY'
import hashlib, hmac, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
def cmd(*a):
    a = [x if isinstance(x, bytes) else x.encode() for x in a]
    s.sendall(b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x), x) for x in a]))
    l = f.readline()
    if l[:1] == b"$":
        n = int(l[1:]); return None if n < 0 else f.read(n + 2)[:-2]
    assert l[:1] in b"+:", l
    return l
cmd("AUTH", os.environ["RPASS"])
a = sys.argv[2:]
if a[0] == "swap":       # swap parts i and j of list a[1]
    k, i, j = a[1], a[2], a[3]; pi, pj = cmd("LINDEX", k, i), cmd("LINDEX", k, j)
    cmd("LSET", k, i, pj); cmd("LSET", k, j, pi)
elif a[0] == "copy":     # part i of list a[1] into list a[3] at i
    cmd("LSET", a[3], a[2], cmd("LINDEX", a[1], a[2]))
elif a[0] == "flip":     # one bit of part i of list a[1], at byte a[3]
    p = bytearray(cmd("LINDEX", a[1], a[2])); p[int(a[3])] ^= 0x10; cmd("LSET", a[1], a[2], bytes(p))
elif a[0] == "cut":      # entry (hash a[1], list a[2]) one part shorter, its metadata and tags to match
    mk, vk = a[1], a[2]; p = cmd("RPOP", vk)
    cmd("HSET", mk, "parts", str(int(cmd("HGET", mk, "parts")) - 1), "bytes", str(int(cmd("HGET", mk, "bytes")) - len(p)),
        "macs", cmd("HGET", mk, "macs")[:-32])
elif a[0] == "grow":     # 16 bytes more on the last part, the size to match
    mk, vk = a[1], a[2]; cmd("LSET", vk, "-1", cmd("LINDEX", vk, "-1") + bytes(16)); cmd("HINCRBY", mk, "bytes", "16")
elif a[0] == "v1":       # the entry retagged as an older host (v1) writes one: HMAC-SHA256 tags, no mac_alg
    mk, vk, sid, key, K = a[1], a[2], a[3], a[4], bytes.fromhex(os.environ["TKEY"])
    n, total, nonce = int(cmd("HGET", mk, "parts")), int(cmd("HGET", mk, "bytes")), os.urandom(16)
    tags = "".join(hmac.new(K, b"cacheblend-part-v1\0" + sid.encode() + key.encode() + nonce +
                            struct.pack("<QQQQ", i, n, total, len(p)) + p, hashlib.sha256).hexdigest()
                   for i, p in ((i, cmd("LINDEX", vk, str(i))) for i in range(n)))
    cmd("HSET", mk, "mac_nonce", nonce.hex(), "macs", tags); cmd("HDEL", mk, "mac_alg")
PY
}
planted=0 refused=0
# fresh NAME: a query host with the tier key and an empty local tier (cb-run keeps what it streams)
fresh() { rm -rf "$T/$1"; $STORE --store "$T/$1" init --tier "main=$T/$1/t" --tier "shared=$URL" --auth-file "$T/query.auth" \
    --key-file "$T/tier.key" > /dev/null 2>> "$T/all-err"; }
# check_attack NAME [WHY]: a fresh query host's answer after a plant, refused because of WHY (a regex)
check_attack() {
    planted=$((planted + 1))
    fresh "qa$planted"
    run "qa$planted" "a$planted"; rc=$?
    nr=$(stat_of "a$planted" shared n_refused 2>/dev/null || echo -1)
    refused=$((refused + nr))
    [ $rc -eq 0 ] && [ "$nr" -eq 1 ] && cmp -s "$T/lg-a$planted" "$T/lg-ref" && grep -q "${2:-MAC}" "$T/err-a$planted" \
        && ok "$1: refused (n_refused 1, warned: ${2:-MAC}), the answer is the one without K" \
        || { not_ok "$1 (exit $rc, n_refused $nr)"; sed 's/^/#   /' "$T/err-a$planted" | head -3; }
}
# 1. the forged entry without a MAC, as a host without the key writes one
plant atk
[ -z "$(r cb-cron "$CRON" HGET "$MK" mac_key)" ] && [ "$(r cb-cron "$CRON" HGET "$MK" bytes)" -gt 0 ] \
    && ok "attack 1 planted: K holds the forged value, well-formed, checksums valid, no MAC" || not_ok "plant 1"
run nokey fooled   # the other entries are sealed: misses for it; the forged one it reads
[ "$(stat_of fooled n_chunks_missing)" -eq $(($(stat_of fooled n_chunks) - 1)) ] && ! cmp -s "$T/lg-fooled" "$T/lg-none" \
    && ok "a reader without the tier key uses it: its answer changes (what the key prevents)" || not_ok "the forged entry does not bite"
check_attack "attack 1 (no MAC)" "carries no MAC"
# 2. the forged value under the legitimate entry's MAC fields
plant atk
r cb-cron "$CRON" HSET "$MK" mac_key "$(sed -n 1p "$T/legit-mac")" mac_nonce "$(sed -n 2p "$T/legit-mac")" macs "$(sed -n 3p "$T/legit-mac")" \
    mac_alg "$(sed -n 4p "$T/legit-mac")" > /dev/null
check_attack "attack 2 (the forged value, K's legitimate MACs)" "part [0-9]*: its MAC does not verify"
# 3. MACs made with a key of the attacker's own
plant atk2
[ "$(r cb-cron "$CRON" HGET "$MK" mac_key)" != "$(sed -n 1p "$T/legit-mac")" ] || not_ok "plant 3"
check_attack "attack 3 (MACs made with another key)" "another tier key"
# 4. K's own legitimate parts, reordered (layers 0 and 1 swapped)
restore; rawcmd swap "$VK" 1 2
check_attack "attack 4 (K's own parts reordered)" "part 1: its MAC does not verify"
# 5. a legitimate part of another entry of the same size in K's place
restore
K2=$(for k in $(radm ZRANGE "cb:$SID:lru" 0 -1); do [ "$k" != "$K" ] && [ "$(radm HGET "cb:{$SID:$k}:m" bytes)" = "$(radm HGET "$MK" bytes)" ] && echo "$k"; done | head -n 1)
if [ -n "$K2" ]; then
    rawcmd copy "cb:{$SID:$K2}:v" 1 "$VK"
    check_attack "attack 5 (another entry's legitimate part)" "part 1: its MAC does not verify"
else
    skip "attack 5 (another entry's part)" "no other entry of K's size"
fi
# 6. K's legitimate parts and tags under another upload's nonce
restore; r cb-cron "$CRON" HSET "$MK" mac_nonce "$(rnd)$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')" > /dev/null
check_attack "attack 6 (another nonce)" "part 0: its MAC does not verify"
# 7. one bit of a layer changed
restore; rawcmd flip "$VK" 2 100
check_attack "attack 7 (one bit of layer 1)" "part 2: its MAC does not verify"
# 8. the entry cut short by its last part, count, size and tags made to match (the tags bind N)
restore; rawcmd cut "$MK" "$VK"
check_attack "attack 8 (one part fewer, the metadata to match)" "part 0: its MAC does not verify"
# 9. 16 bytes more at the end, the size to match (the tags bind TOTAL and each part's length)
restore; rawcmd grow "$MK" "$VK"
check_attack "attack 9 (16 bytes more, the size to match)" "part 0: its MAC does not verify"
# 10. the tags taken away, everything else left
restore; radm HDEL "$MK" macs > /dev/null   # as Redis' admin: the cron user has no HDEL
check_attack "attack 10 (no tags)" "its MAC is malformed"
# 11. an algorithm this version does not know
restore; r cb-cron "$CRON" HSET "$MK" mac_alg hmac-md5-v0 > /dev/null
check_attack "attack 11 (an unknown mac_alg)" "algorithm hmac-md5-v0 is unknown"
# 12. K's entry as an older host (v1: HMAC-SHA256 tags, no mac_alg) writes it, with the right key:
#     not read any more (cb-store(5) says why); a keyed writer replaces it
restore; TKEY=$(cat "$T/tier.key") rawcmd v1 "$MK" "$VK" "$SID" "$K"
[ "$(radm HSTRLEN "$MK" macs)" -eq $((64 * $(radm HGET "$MK" parts))) ] && [ "$(radm HEXISTS "$MK" mac_alg)" -eq 0 ] \
    || not_ok "plant 12 (a v1 entry)"
check_attack "attack 12 (an older host's v1 entry, no mac_alg)" "names no algorithm"
# 13. that v1 entry relabelled as this version's algorithm
r cb-cron "$CRON" HSET "$MK" mac_alg aes-256-gcm-v3 > /dev/null
check_attack "attack 13 (a v1 entry with mac_alg aes-256-gcm-v3)" "its MAC is malformed"
radm HDEL "$MK" mac_alg > /dev/null   # a v1 entry again
$STORE --store "$T/cron" rm "$K" > /dev/null 2>&1; $STORE --store "$T/cron" put "$T/k.kv" > /dev/null 2>> "$T/all-err"
[ "$(radm HGET "$MK" mac_alg)" = aes-256-gcm-v3 ] && [ "$(radm HSTRLEN "$MK" macs)" -eq $((32 * $(radm HGET "$MK" parts))) ] \
    && ok "the cron host's put replaces the v1 entry with an aes-256-gcm-v3 one" || not_ok "a v1 entry is not replaced"
[ $refused -eq $planted ] && ok "forged entries used: 0 of $planted planted ($refused refused)" || not_ok "refused $refused of $planted"
restore
fresh qb; run qb after
[ "$(stat_of after n_chunks_missing)" -eq 0 ] && cmp -s "$T/lg-after" "$T/lg-legit" && ok "K restored by the cron host is read again" \
    || not_ok "after the restore"
"$STORE" --store "$T/cron" verify > "$T/out" 2> "$T/err"; rc=$?; cat "$T/err" >> "$T/all-err"
[ $rc -eq 0 ] && ok "verify on the cron host (every entry's MACs) is clean" || { not_ok "verify (exit $rc)"; sed 's/^/#   /' "$T/out" | head -3; }
plant atk
"$STORE" --store "$T/cron" verify > "$T/out" 2> "$T/err"; rc=$?; cat "$T/err" >> "$T/all-err"
[ $rc -eq 65 ] && grep -q "$K.*no MAC" "$T/out" && ok "verify finds the planted entry (exit 65)" || { not_ok "verify and a planted entry (exit $rc)"; sed 's/^/#   /' "$T/out" | head -3; }
expect_exit "verify --repair drops it" 0 $STORE --store "$T/cron" verify --repair
cat "$T/err" >> "$T/all-err"
restore

# -- the tunnel of cb-store(5): stunnel on both ends, TLS between them
ST=$(command -v stunnel4 || command -v stunnel)
if [ -n "$ST" ] && command -v openssl > /dev/null; then
    TP=$((20000 + $$ % 20000))
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=redis.test \
        -addext subjectAltName=DNS:redis.test -keyout "$T/tls.key" -out "$T/tls.crt" > /dev/null 2>&1
    # the server's end: TLS on a port, to Redis' unix socket; the client's: a unix socket, to that port
    printf 'foreground = yes\npid =\n[redis-tls]\naccept = 127.0.0.1:%s\nconnect = %s\ncert = %s\nkey = %s\n' \
        "$TP" "$SOCK" "$T/tls.crt" "$T/tls.key" > "$T/stunnel-server.conf"
    printf 'foreground = yes\npid =\n[redis-tls]\nclient = yes\naccept = %s\nconnect = 127.0.0.1:%s\nverifyChain = yes\nCAfile = %s\ncheckHost = redis.test\n' \
        "$T/tls.sock" "$TP" "$T/tls.crt" > "$T/stunnel-client.conf"
    "$ST" "$T/stunnel-server.conf" > "$T/stunnel-server.log" 2>&1 & tpids=$!
    "$ST" "$T/stunnel-client.conf" > "$T/stunnel-client.log" 2>&1 & tpids="$tpids $!"
    i=0; while [ ! -S "$T/tls.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    if [ -S "$T/tls.sock" ]; then
        expect_exit "init through the TLS tunnel" 0 $STORE --store "$T/tls" init --tier "main=$T/tls/t" --tier "shared=unix://$T/tls.sock:64M" \
            --auth-file "$T/query.auth" --key-file "$T/tier.key"
        run tls tls
        [ "$(stat_of tls n_chunks_missing)" -eq 0 ] && cmp -s "$T/lg-tls" "$T/lg-legit" \
            && ok "through the tunnel: every chunk read, the same answer" || { not_ok "reading through the tunnel"; sed 's/^/#   /' "$T/err-tls" | head -3; }
        REDISCLI_AUTH=$ADMIN timeout 5 "$RC" --no-auth-warning -h 127.0.0.1 -p "$TP" ping > "$T/plain" 2>&1
        ! grep -q PONG "$T/plain" && ok "the tunnel's port speaks TLS only: a plain client gets nothing" || not_ok "plain text on the TLS port"
    else
        skip "the TLS tunnel" "stunnel did not start ($(tail -n 2 "$T/stunnel-client.log"))"
    fi
    kill $tpids 2>/dev/null; wait $tpids 2>/dev/null; tpids=""
else
    skip "the TLS tunnel" "no stunnel4 or openssl (make deps)"
fi

# -- the secrets: never in store.json, in a program's command line, or in a message
leaks=0
for pw in "$ADMIN" "$CRON" "$QUERY" "$(cat "$T/tier.key")"; do
    grep -qF "$pw" "$T"/*/store.json "$T/ps.log" "$T/all-err" "$T"/err* "$T/out" 2>/dev/null && leaks=$((leaks + 1))
done
[ -s "$T/ps.log" ] && [ -s "$T/all-err" ] && [ $leaks -eq 0 ] \
    && ok "no password or key in store.json, in $(grep -c . "$T/ps.log") lines of ps while the programs ran, or in $(grep -c . "$T/all-err") lines of messages" \
    || not_ok "$leaks secrets leaked"
grep -q "cb-run .*--store" "$T/ps.log" && ok "(ps did see the programs running)" || not_ok "ps never saw cb-run"
done_testing
