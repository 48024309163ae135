#!/bin/sh
# The shared tier's deadlines and its refusals told as they are.  Two fake
# servers (python3): one that logs in and then answers one byte every
# 300 ms, one that accepts and never answers; every connect and request
# against them is bounded by the time-out, so that cb-store init, cb-store
# ls and cb-run return within it and 1 s, and cb-run still answers.  With a
# real redis-server with requirepass: a refused login warned once in a run
# longer than the 5 s retry, and "authenticated" false then; a FIFO or a
# device as a secret file refused at once; a failed init leaves no DIR/lock;
# an entry refused on a read that computes nothing says so truly.  Skips
# where python3 or redis-server is missing.
. "$(dirname "$0")/lib.sh"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if ! command -v python3 > /dev/null; then
    skip "the shared tier's deadlines" "no python3 (the fake servers are python3 scripts)"
    done_testing; exit 0
fi
if [ -z "$RS" ] || [ -z "$RC" ]; then
    skip "the shared tier's deadlines" "no redis-server/redis-cli (make deps)"
    done_testing; exit 0
fi
need_fixture "$M" "the shared tier's deadlines"
TO=1000            # the time-out (ms) everything here runs with
LIMIT=$((TO + 1000)) # and what any command may take with it
# a command that hangs fails its test instead of hanging the suite
if command -v timeout > /dev/null; then GUARD="timeout -k 5 30"; else GUARD=""; fi
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# timed OUT CMD...: run CMD (stdout to $T/OUT, stderr to $T/err-OUT); $rc, $el (ms)
timed() { o=$1; shift; t0=$(now_ms); $GUARD "$@" > "$T/$o" 2> "$T/err-$o"; rc=$?; el=$(($(now_ms) - t0)); }
show() { sed 's/^/#   /' "$T/err-$1" | head -5; }

rnd() { od -An -N12 -tx1 /dev/urandom | tr -d ' \n'; }
PW=pw$(rnd)
umask 077
redis_start --requirepass "$PW"
fpids=""
stop_all() {
    for p in $fpids; do kill "$p" 2>/dev/null; done
    redis_stop
}
trap 'stop_all; rm -rf "$T"' EXIT
radm() { REDISCLI_AUTH=$PW "$RC" --no-auth-warning -s "$SOCK" "$@"; }
if ! radm ping 2>/dev/null | grep -q PONG; then
    skip "the shared tier's deadlines" "redis-server does not start here ($(tail -n 2 "$T/redis.log" 2>/dev/null))"
    done_testing; exit 0
fi
printf '%s\n' "$PW" > "$T/pw.auth"
printf 'wrong%s\n' "$PW" > "$T/wrong.auth"
$STORE keygen "$T/tier.key" > /dev/null 2>&1
URL="unix://$SOCK:64M"

# -- a store on the real server, its chunks written through; full prefill's answer
vale_chunks "$M" "$T/chunks.jsonl" || { not_ok "cb-chunk"; done_testing; exit 1; }
$STORE --store "$T/a" init --tier "main=$T/a/t" --tier "shared=$URL" --timeout $TO \
    --auth-file "$T/pw.auth" --key-file "$T/tier.key" > /dev/null 2>&1 \
    && "$PRE" -m "$M" --store "$T/a" -q < "$T/chunks.jsonl" > /dev/null 2>&1 \
    && ok "a store with a shared tier (requirepass, a tier key), its chunks precomputed" \
    || { not_ok "the store on redis-server"; done_testing; exit 1; }
"$RUN" -m "$M" --chunks "$T/chunks.jsonl" --mode full --no-store-write -n 6 -p "$Q" > "$T/a-full" 2>/dev/null \
    || { not_ok "cb-run --mode full"; done_testing; exit 1; }
# run HOST OUT [ARGS]: cb-run at ratio 1 on store HOST, timed, with the environment $RUNENV;
# answer in $T/OUT, stats in $T/st-OUT.json
RUNENV=
run() { h=$1; o=$2; shift 2
    timed "$o" env $RUNENV "$RUN" -m "$M" --store "$T/$h" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --stats "$T/st-$o.json" "$@"; }
stat_of() { f=$1; shift; python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[k]
print(d)' "$T/st-$f.json" "$@" 2>/dev/null; }
# point HOST URL: store HOST gets a's shared tier (its id, secrets, time-out) at URL
point() { python3 - "$T/a/store.json" "$T/$1/store.json" "$2" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); g = json.load(open(sys.argv[2]))
g["shared"] = dict(a["shared"]); g["shared"]["url"] = sys.argv[3]
json.dump(g, open(sys.argv[2], "w"))
PY
}

# -- the fake servers
cat > "$T/fake.py" <<'PY'
import os, socket, sys, threading, time
# fake.py MODE ADDR: trickle: logs in (AUTH, HELLO, SELECT, PING, CLIENT: +OK at once),
# then answers anything else with one byte every 300 ms of a reply that never ends;
# silent: accepts and never answers.  ADDR: a unix socket, or tcp:FILE (a loopback
# port of the system's choosing, written to FILE).
mode, addr = sys.argv[1], sys.argv[2]
LOGIN = {b"AUTH", b"HELLO", b"SELECT", b"PING", b"CLIENT"}
def commands(c):
    buf = b""
    while True:
        while buf.startswith(b"*") and b"\r\n" in buf:
            head, rest = buf.split(b"\r\n", 1)
            args = []
            for _ in range(int(head[1:])):
                if b"\r\n" not in rest:
                    break
                ln, rest = rest.split(b"\r\n", 1)
                if len(rest) < int(ln[1:]) + 2:
                    break
                args.append(rest[:int(ln[1:])]); rest = rest[int(ln[1:]) + 2:]
            else:
                buf = rest
                yield args
                continue
            break
        d = c.recv(65536)
        if not d:
            return
        buf += d
def serve(c):
    try:
        if mode == "silent":
            while c.recv(65536):
                pass
            return
        for args in commands(c):
            if args and args[0].upper() in LOGIN:
                c.sendall(b"+OK\r\n")
                continue
            c.sendall(b"$1000000\r\n")
            while True:
                time.sleep(0.3); c.sendall(b"x")
    except OSError:
        pass
if addr.startswith("tcp:"):
    s = socket.socket(); s.bind(("127.0.0.1", 0))
    open(addr[4:] + ".tmp", "w").write(str(s.getsockname()[1])); os.rename(addr[4:] + ".tmp", addr[4:])
else:
    s = socket.socket(socket.AF_UNIX); s.bind(addr)
s.listen(64); s.settimeout(300)
while True:
    try:
        c, _ = s.accept()
    except OSError:
        break
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
python3 "$T/fake.py" trickle "$T/trickle.sock" > /dev/null 2>&1 & fpids="$fpids $!"
python3 "$T/fake.py" silent "tcp:$T/silent.port" > /dev/null 2>&1 & fpids="$fpids $!"
i=0; while { [ ! -S "$T/trickle.sock" ] || [ ! -s "$T/silent.port" ]; } && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$T/trickle.sock" ] && [ -s "$T/silent.port" ] && ok "two fake servers: one trickling, one silent" \
    || { not_ok "the fake servers do not start"; done_testing; exit 1; }

for f in trickle silent; do
    if [ $f = trickle ]; then FURL=unix://$T/trickle.sock; what="a server that trickles a byte every 300 ms"
    else FURL=redis://127.0.0.1:$(cat "$T/silent.port")/0; what="a server that never answers"; fi
    # cb-store init: the connect and the login, then the tier's id
    timed init-$f $STORE --store "$T/x-$f" init --tier "main=$T/x-$f/t" --tier "shared=$FURL:64M" \
        --timeout $TO --auth-file "$T/pw.auth"
    [ $rc -eq 74 ] && [ $el -le $LIMIT ] && grep -q "timed out after $TO ms" "$T/err-init-$f" \
        && ok "$what: cb-store init fails in $el ms (exit 74), saying it timed out" \
        || { not_ok "$what: cb-store init (exit $rc, $el ms)"; show init-$f; }
    [ ! -e "$T/x-$f" ] && ok "$what: the failed init leaves nothing behind (no DIR/lock)" \
        || not_ok "$what: the failed init left $(ls -A "$T/x-$f" | tr '\n' ' ')"
    # a store whose shared tier is that server
    $STORE --store "$T/g-$f" init --tier "main=$T/g-$f/t" > /dev/null 2>&1 && point g-$f "$FURL"
    timed ls-$f $STORE --store "$T/g-$f" ls
    [ $rc -ne 124 ] && [ $el -le $LIMIT ] && grep -q "timed out after $TO ms" "$T/err-ls-$f" \
        && ok "$what: cb-store ls returns in $el ms (exit $rc), saying it timed out" \
        || { not_ok "$what: cb-store ls (exit $rc, $el ms)"; show ls-$f; }
    run g-$f run-$f --no-store-write
    [ $rc -eq 0 ] && [ $el -le $LIMIT ] && cmp -s "$T/run-$f" "$T/a-full" \
        && ok "$what: cb-run answers in $el ms, equal to full prefill at ratio 1" \
        || { not_ok "$what: cb-run (exit $rc, $el ms)"; show run-$f; }
    [ "$(grep -c "shared tier" "$T/err-run-$f")" -eq 1 ] && grep -q "timed out after $TO ms.*not used again" "$T/err-run-$f" \
        && [ "$(stat_of run-$f n_chunks_missing)" = "$(stat_of run-$f n_chunks)" ] \
        && ok "$what: one warning, the tier not used again in the run, every chunk computed" \
        || { not_ok "$what: cb-run's warnings"; show run-$f; }
done
# a put (cb-precompute writes through): the upload bounded too
$STORE --store "$T/p" init --tier "main=$T/p/t" > /dev/null 2>&1 && point p "unix://$T/trickle.sock"
timed pre $PRE -m "$M" --store "$T/p" -q < "$T/chunks.jsonl"
np=$($STORE --store "$T/p" ls --tier main 2>/dev/null | wc -l); na=$($STORE --store "$T/a" ls --tier main 2>/dev/null | wc -l)
[ $rc -eq 0 ] && [ $el -le $((LIMIT + 1000)) ] && [ "$np" -eq "$na" ] \
    && ok "a trickling server: cb-precompute stores every chunk locally in $el ms" \
    || { not_ok "a trickling server: cb-precompute (exit $rc, $el ms, $np entries of $na)"; show pre; }

# -- a refused login: one warning however long the run, the tier not used, not "authenticated"
$STORE --store "$T/e" init --tier "main=$T/e/t" > /dev/null 2>&1 && point e "unix://$SOCK"
sed -n 1p "$T/chunks.jsonl" > "$T/one.jsonl"
python3 - "$T/chunks.jsonl" "$Q" > "$T/batch.jsonl" <<'PY'
import json, sys
ch = [json.loads(l) for l in open(sys.argv[1])]
for i in range(2):
    print(json.dumps({"id": i, "question": sys.argv[2], "chunks": ch}))
PY
t0=$(now_ms)
{ sed -n 1p "$T/batch.jsonl"; sleep 5.5; sed -n 2p "$T/batch.jsonl"; } \
    | CB_REDIS_AUTH_FILE=$T/wrong.auth $GUARD "$RUN" -m "$M" --store "$T/e" -n 2 --no-store-write --batch - > "$T/ans-batch" 2> "$T/err-batch"
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$T/ans-batch")" -eq 2 ] && [ "$(grep -c "refused the login" "$T/err-batch")" -eq 1 ] \
    && ok "a wrong password: one warning in a run of $(($(now_ms) - t0)) ms (longer than the 5 s retry), both answered" \
    || { not_ok "a wrong password in a long run (exit $rc): $(grep -c "refused the login" "$T/err-batch") warnings"; show batch; }
RUNENV=CB_REDIS_AUTH_FILE=$T/wrong.auth; run e wrongpw --no-store-write; RUNENV=
[ $rc -eq 0 ] && [ "$(stat_of wrongpw shared authenticated)" = False ] && [ "$(stat_of wrongpw shared login_refused)" = True ] \
    && ok "--stats after a refused login: authenticated false, login_refused true" \
    || { not_ok "--stats after a refused login: $(stat_of wrongpw shared)"; show wrongpw; }
run e rightpw --no-store-write
[ $rc -eq 0 ] && [ "$(stat_of rightpw shared authenticated)" = True ] && [ "$(stat_of rightpw shared login_refused)" = False ] \
    && [ "$(stat_of rightpw n_chunks_missing)" -eq 0 ] \
    && ok "--stats after the login: authenticated true, every chunk from the shared tier" \
    || { not_ok "--stats after the login: $(stat_of rightpw shared)"; show rightpw; }
CB_REDIS_AUTH_FILE=$T/wrong.auth $STORE --store "$T/e" stat > "$T/stat-e" 2>/dev/null
grep -q "login with a password (refused by the server" "$T/stat-e" && ! grep -q "authenticated" "$T/stat-e" \
    && ok "cb-store stat says the login was refused, and nothing of authenticated entries" \
    || { not_ok "cb-store stat after a refused login"; sed 's/^/#   /' "$T/stat-e"; }
mkdir -p "$T/y"
expect_exit "init into an existing directory with a wrong password" 74 $STORE --store "$T/y" init --tier "main=$T/y/t" \
    --tier "shared=$URL" --auth-file "$T/wrong.auth"
[ -d "$T/y" ] && [ -z "$(ls -A "$T/y")" ] && ok "the directory is kept, empty: no lock left" || not_ok "left in $T/y: $(ls -A "$T/y" | tr '\n' ' ')"

# -- secret files that are not regular files: refused at once, never waited on
mkfifo "$T/fifo"
for opt in auth-file key-file; do
    timed fifo-$opt $STORE --store "$T/z" init --tier "main=$T/z/t" --tier "shared=$URL" --$opt "$T/fifo"
    [ $rc -eq 65 ] && [ $el -le 2000 ] && grep -q "$T/fifo: not a regular file" "$T/err-fifo-$opt" \
        && ok "a FIFO as --$opt: exit 65 in $el ms, naming it" || { not_ok "a FIFO as --$opt (exit $rc, $el ms)"; show fifo-$opt; }
done
timed dev $STORE --store "$T/z" init --tier "main=$T/z/t" --tier "shared=$URL" --key-file /dev/zero
[ $rc -eq 65 ] && grep -q "/dev/zero: not a regular file" "$T/err-dev" && ok "a device as --key-file: exit 65" \
    || { not_ok "a device as --key-file (exit $rc)"; show dev; }
timed fifo-env env CB_TIER_KEY_FILE="$T/fifo" "$RUN" -m "$M" --store "$T/a" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" --no-store-write
[ $rc -eq 0 ] && [ $el -le 5000 ] && grep -q "not a regular file.*it is not used" "$T/err-fifo-env" && cmp -s "$T/fifo-env" "$T/a-full" \
    && ok "a FIFO as \$CB_TIER_KEY_FILE: cb-run warns and answers in $el ms" || { not_ok "a FIFO as \$CB_TIER_KEY_FILE (exit $rc, $el ms)"; show fifo-env; }

# -- an entry refused where nothing is computed: the warning says what happens
SID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shared"]["id"])' "$T/a/store.json")
K=$(radm ZRANGE "cb:$SID:lru" 0 0)
radm LSET "cb:{$SID:$K}:v" 0 forged > /dev/null   # a part changed: refused by its size or MAC
$STORE --store "$T/h" init --tier "main=$T/h/t" > /dev/null 2>&1 && point h "unix://$SOCK"
timed get $STORE --store "$T/h" get "$K" -o "$T/k.kv"
[ $rc -ne 0 ] && [ ! -s "$T/k.kv" ] && grep -q "$K: .*; dropped (a miss)" "$T/err-get" && ! grep -q "computed" "$T/err-get" \
    && [ "$(radm EXISTS "cb:{$SID:$K}:m")" -eq 0 ] \
    && ok "cb-store get of a forged entry: \"dropped (a miss)\", dropped indeed, nothing said computed" \
    || { not_ok "cb-store get of a forged entry (exit $rc)"; show get; }
done_testing
