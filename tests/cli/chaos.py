#!/usr/bin/env python3
"""tests/cli/chaos.py - the helpers of tests/cli/chaos.sh.

  chaos.py proxy LISTEN_PORT_FILE REDIS_PORT
      a slow TCP proxy in front of redis-server: every byte either way is
      forwarded in pieces of 1 to 1024 bytes, each after 0 to 3 ms, and now
      and then (one piece in 150) after a stall of 0.2 to 1.2 s, longer
      than the shared tier's time-out about half the time.
  chaos.py start T MODE SERVER SOCK PASSWORD DIR
      starts the run's redis-server (MODE: none, aof or rdb persistence) on
      a free port in 20000-29999 and a unix socket, and prints the port.
  chaos.py chaos T SECONDS HOSTS TMPFS
      the chaos loop: a fault every 0.1 to 0.5 s, for SECONDS: SIGKILL of
      a host's running program, Redis stopped (SIGSTOP) for 0.1 to 0.8 s,
      an entry tampered with (a byte of a part flipped, a part cut short,
      removed, or taken from another entry, the value or the metadata
      deleted or replaced by a key of the wrong Redis type, a metadata
      field changed), Redis restarted (its persistence chosen anew), the
      tmpfs TMPFS filled for 2 to 5 s.  Logs them to T/faults.log and
      T/tamper.log, and the server's state to T/state.
  chaos.py analyze T
      reads what the hosts logged in T, computes the reference logits the
      answers need (cb-run on a clean local store holding the chunks the
      answer found cached) and prints the summary as TAP.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time


def proxy(port_file, redis_port):
    def pump(src, dst):
        try:
            while True:
                d = src.recv(4096)
                if not d:
                    break
                while d:
                    n = random.randint(1, 1024)
                    if random.randrange(150) == 0:
                        time.sleep(random.uniform(0.2, 1.2))
                    else:
                        time.sleep(random.uniform(0, 0.003))
                    dst.sendall(d[:n])
                    d = d[n:]
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(c):
        try:
            r = socket.create_connection(("127.0.0.1", redis_port), timeout=2)
            r.settimeout(None)
        except OSError:
            c.close()
            return
        threading.Thread(target=pump, args=(c, r), daemon=True).start()
        pump(r, c)

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for _ in range(50):
        p = random.randint(20000, 29999)
        try:
            s.bind(("127.0.0.1", p))
            break
        except OSError:
            continue
    s.listen(64)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(p))
    os.rename(port_file + ".tmp", port_file)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


class Resp:
    """A minimal RESP2 client over a unix socket (binary-safe, unlike redis-cli)."""

    def __init__(self, path, password):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(5)
        self.s.connect(path)
        self.buf = b""
        self.cmd(b"AUTH", password.encode())

    def line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise OSError("connection closed")
            self.buf += d
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def take(self, n):
        while len(self.buf) < n + 2:
            d = self.s.recv(65536)
            if not d:
                raise OSError("connection closed")
            self.buf += d
        v, self.buf = self.buf[:n], self.buf[n + 2:]
        return v

    def reply(self):
        ln = self.line()
        t, rest = ln[:1], ln[1:]
        if t == b"+":
            return rest
        if t == b"-":
            return RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            return None if int(rest) < 0 else self.take(int(rest))
        if t == b"*":
            return None if int(rest) < 0 else [self.reply() for _ in range(int(rest))]
        raise OSError("bad reply %r" % ln)

    def cmd(self, *args):
        a = [x if isinstance(x, bytes) else str(x).encode() for x in args]
        self.s.sendall(b"".join([b"*%d\r\n" % len(a)] + [b"$%d\r\n%s\r\n" % (len(x), x) for x in a]))
        return self.reply()


def tamper(sock, password, sid, log, run=0):
    r = Resp(sock, password)
    r.s.settimeout(2)
    keys = r.cmd(b"ZRANGE", "cb:%s:lru" % sid, 0, -1)
    if not isinstance(keys, list) or not keys:
        return None
    k = random.choice(keys).decode()
    m, v = "cb:{%s:%s}:m" % (sid, k), "cb:{%s:%s}:v" % (sid, k)
    n = r.cmd(b"LLEN", v)
    n = n if isinstance(n, int) else 0
    acts = ["flip", "flip", "flip", "cut", "pop", "swap", "del-v", "del-m", "type-v", "type-m", "field"]
    if n == 0:
        acts = ["del-m", "type-m", "field"]
    act = random.choice(acts)
    p = random.randrange(n) if n else 0
    if act == "flip":
        b = r.cmd(b"LINDEX", v, p)
        if not b:
            return None
        b = bytearray(b)
        b[random.randrange(len(b))] ^= 1 << random.randrange(8)
        r.cmd(b"LSET", v, p, bytes(b))
    elif act == "cut":
        b = r.cmd(b"LINDEX", v, p)
        if not b:
            return None
        r.cmd(b"LSET", v, p, b[:random.randrange(len(b))])
    elif act == "pop":
        r.cmd(random.choice([b"RPOP", b"LPOP"]), v)
    elif act == "swap":
        others = [x.decode() for x in keys if x.decode() != k]
        if not others:
            return None
        o = random.choice(others)
        b = r.cmd(b"LINDEX", "cb:{%s:%s}:v" % (sid, o), p)
        if not b:
            return None
        r.cmd(b"LSET", v, p, b)
    elif act == "del-v":
        r.cmd(b"DEL", v)
    elif act == "del-m":
        r.cmd(b"DEL", m)
    elif act == "type-v":
        r.cmd(b"DEL", v)
        r.cmd(b"SET", v, b"not a list")
    elif act == "type-m":
        r.cmd(b"DEL", m)
        r.cmd(b"RPUSH", m, b"not", b"a", b"hash")
    elif act == "field":
        f = random.choice(["parts", "bytes", "tokens", "checksum", "macs", "mac_nonce", "mac_alg", "mac_key"])
        old = r.cmd(b"HGET", m, f)
        if old is None or isinstance(old, Exception):
            return None
        if f in ("parts", "bytes", "tokens"):
            new = str(max(0, int(old) + random.choice([-1, 1, 7, -int(old) // 2 or 1]))).encode()
        else:
            new = bytearray(old)
            new[random.randrange(len(new))] = ord(random.choice("0123456789abcdef"))
            new = bytes(new) if bytes(new) != old else old[::-1]
        r.cmd(b"HSET", m, f, new)
        act += ":" + f
    with open(log, "a") as fl:
        fl.write("%.3f %s %s %s\n" % (time.time(), act, k, run))
    return act + " " + k


class Redis:
    """The private redis-server of a chaos run (T/redis.json) and the run's state file,
    T/state: GEN:MODE:RUN:FILL, the Redis generation (one more at every stop and
    start), its persistence (none, aof, rdb; down while stopped), the durable run (one
    more at every start that loses the data) and the tmpfs fills (odd while one is on),
    written atomically before every change takes effect and after it has."""

    PERSIST = {"none": ["--save", "", "--appendonly", "no"],
               "aof": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
               "rdb": ["--save", "3600 1", "--appendonly", "no"]}

    def __init__(self, T):
        self.T = T
        self.c = json.load(open(os.path.join(T, "redis.json")))
        st = os.path.join(T, "state")
        if os.path.exists(st):
            g, m, r, f = open(st).read().split()[0].split(":")
            self.gen, self.mode, self.run, self.fill = int(g), m, int(r), int(f)
        else:
            self.gen, self.mode, self.run, self.fill = 0, "down", 0, 0
        self.last = self.c.get("last_mode", "")

    def save_state(self):
        p = os.path.join(self.T, "state")
        with open(p + ".tmp", "w") as f:
            f.write("%d:%s:%d:%d\n" % (self.gen, self.mode, self.run, self.fill))
        os.rename(p + ".tmp", p)

    def pid(self):
        try:
            return int(open(self.c["pidfile"]).read())
        except (OSError, ValueError):
            return 0

    def ping(self):
        try:
            return Resp(self.c["sock"], self.c["password"]).cmd(b"PING") == b"PONG"
        except (OSError, RuntimeError):
            return False

    def start(self, mode):
        d = self.c["dir"]
        if mode == "none" or mode != self.last:
            subprocess.run(["rm", "-rf", d])
            self.run += 1
        os.makedirs(d, exist_ok=True)
        for _ in range(5):
            port = self.c["port"] or random.randint(20000, 29999)
            subprocess.run([self.c["server"], "--bind", "127.0.0.1", "--port", str(port), "--unixsocket", self.c["sock"],
                            "--unixsocketperm", "700", "--requirepass", self.c["password"], "--dir", d,
                            "--daemonize", "yes", "--pidfile", self.c["pidfile"], "--logfile", self.c["log"]]
                           + self.PERSIST[mode], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(200):
                if self.ping():
                    break
                time.sleep(0.05)
            else:
                if not self.c["port"]:   # another port, before the hosts know this one
                    continue
                time.sleep(0.5)
                continue
            self.c["port"] = port
            break
        else:
            return False
        self.last = self.mode = mode
        self.c["last_mode"] = mode
        json.dump(self.c, open(os.path.join(self.T, "redis.json"), "w"))
        self.gen += 1
        self.save_state()
        return True

    def stop(self, how):
        """how: kill (SIGKILL) or shutdown (SHUTDOWN, which saves an RDB's data)."""
        self.gen += 1
        self.mode = "down"
        self.save_state()
        p = self.pid()
        if p:
            os.kill(p, signal.SIGCONT)
        if how == "kill" and p:
            os.kill(p, signal.SIGKILL)
        else:
            try:
                Resp(self.c["sock"], self.c["password"]).cmd(b"SHUTDOWN")
            except (OSError, RuntimeError):
                pass
        for _ in range(200):
            if not p or not alive(p):
                break
            time.sleep(0.05)
        else:
            os.kill(p, signal.SIGKILL)
            time.sleep(0.2)
        for f in (self.c["pidfile"], self.c["sock"]):
            try:
                os.unlink(f)
            except OSError:
                pass


def alive(p):
    try:
        os.kill(p, 0)
    except OSError:
        return False
    try:   # a zombie (our own child, not yet reaped) is dead too
        return open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(T, mode, server, sock, password, rdir):
    """The first start: T/redis.json written, the port chosen printed."""
    json.dump({"server": server, "port": 0, "sock": sock, "password": password, "dir": rdir,
               "pidfile": os.path.join(T, "redis.pid"), "log": os.path.join(T, "redis.log")},
              open(os.path.join(T, "redis.json"), "w"))
    r = Redis(T)
    if not r.start(mode):
        sys.exit(1)
    print(r.c["port"])


def shared_acks(T, run, tampered):
    """The entries of acks.log that Redis must still hold while durable run `run`
    lasts: (host, key, generation) of each written by a cb-precompute that exited 0
    without a warning, in one generation that persisted (AOF or RDB), of that run,
    the entry not tampered with in that run ((key, run) not in tampered)."""
    out = []
    for ln in open(os.path.join(T, "acks.log")):
        a = ln.split()
        if a[1] == "WIPE":
            continue
        h, k, rc, warn, s0, s1 = a[:6]
        g0, g1 = s0.split(":"), s1.split(":")
        if (rc == "0" and warn == "0" and g0[:3] == g1[:3] and g0[1] in ("aof", "rdb") and g0[2] == str(run)
                and (k, g0[2]) not in tampered):
            out.append((h, k, g0[0]))
    return out


def tampered_keys(T):
    """(key, durable run) of every entry tampered with: Redis keeps the damage for that run."""
    p = os.path.join(T, "tamper.log")
    return {(ln.split()[2], ln.split()[3]) for ln in open(p)} if os.path.exists(p) else set()


def check_shared(T, r, sid):
    """Before Redis stops, and at the end: every entry shared_acks says Redis holds is
    there whole (metadata, and as many parts as it says), in T/shared-checks.log."""
    if r.mode not in ("aof", "rdb"):
        return
    try:
        c = Resp(r.c["sock"], r.c["password"])
        with open(os.path.join(T, "shared-checks.log"), "a") as f:
            for h, k, g in shared_acks(T, r.run, tampered_keys(T)):
                m, v = "cb:{%s:%s}:m" % (sid, k), "cb:{%s:%s}:v" % (sid, k)
                parts, n = c.cmd(b"HGET", m, b"parts"), c.cmd(b"LLEN", v)
                ok = isinstance(parts, bytes) and isinstance(n, int) and int(parts) == n > 0
                f.write("%d %s %s %s %s\n" % (r.run, k, h, g, "ok" if ok else "lost:parts=%s,llen=%s" % (parts, n)))
    except (OSError, RuntimeError, ValueError) as e:
        sys.stderr.write("chaos.py: the shared tier not checked: %s\n" % e)


def chaos(T, secs, hosts, tmpfs):
    """The chaos loop: a fault every 0.1 to 0.5 s, for secs seconds."""
    r = Redis(T)
    sid = json.load(open(os.path.join(T, hosts[0], "store.json")))["shared"]["id"]
    flog = open(os.path.join(T, "faults.log"), "a")

    def fault(*what):
        flog.write("%.3f %s\n" % (time.time(), " ".join(what)))
        flog.flush()

    end = time.time() + secs
    fill_until = last_restart = 0
    while time.time() < end:
        time.sleep(random.uniform(0.1, 0.5))
        if r.fill % 2 and time.time() >= fill_until:
            try:
                os.unlink(os.path.join(tmpfs, "fill"))
            except OSError:
                pass
            r.fill += 1
            r.save_state()
            fault("unfill")
        x = random.randrange(12)
        if x < 4:     # SIGKILL of a host's running program (the child of its timeout)
            h = random.choice(hosts)
            try:
                tp = int(open(os.path.join(T, "cur-" + h)).read())
                ch = open("/proc/%d/task/%d/children" % (tp, tp)).read().split()
                # only one of ours: before its exec the child is still timeout
                if ch and open("/proc/%s/comm" % ch[0]).read().startswith("cb-"):
                    os.kill(int(ch[0]), signal.SIGKILL)
                    fault("kill", h)
            except (OSError, ValueError):
                pass
        elif x < 6:   # Redis stopped for 0.1-0.8 s
            p = r.pid()
            if p:
                d = random.uniform(0.1, 0.8)
                fault("sigstop", "%.1f" % d)
                os.kill(p, signal.SIGSTOP)
                time.sleep(d)
                os.kill(p, signal.SIGCONT)
        elif x < 9:   # an entry tampered with
            try:
                what = tamper(r.c["sock"], r.c["password"], sid, os.path.join(T, "tamper.log"), r.run)
                if what:
                    fault("tamper", what)
            except (OSError, RuntimeError):
                pass
        elif x == 9:  # Redis restarted: without persistence, with an AOF, or with an RDB
            if time.time() - last_restart < 3:
                continue
            how = "shutdown" if r.mode == "rdb" or (r.mode == "aof" and random.randrange(2)) else "kill"
            # a persisting server comes back the same way half the time: its data then kept
            nxt = random.choice(["none", "aof", "rdb"] + ([r.mode] * 3 if r.mode in ("aof", "rdb") else []))
            check_shared(T, r, sid)
            fault("stop", how, r.mode)
            r.stop(how)
            time.sleep(random.uniform(0.1, 0.5))
            if not r.start(nxt):
                fault("start-failed", nxt)
                sys.exit(1)
            fault("start", nxt)
            last_restart = time.time()
        elif x == 10 and tmpfs and r.fill % 2 == 0:   # the tmpfs filled for 2-5 s
            r.fill += 1
            r.save_state()
            try:
                with open(os.path.join(tmpfs, "fill"), "wb") as f:
                    for _ in range(64):
                        f.write(b"\0" * 65536)
            except OSError:
                pass
            fill_until = time.time() + random.uniform(2, 5)
            fault("fill")
    # the end: Redis running, the tmpfs emptied
    p = r.pid()
    if p:
        os.kill(p, signal.SIGCONT)
    check_shared(T, r, sid)
    if r.fill % 2:
        try:
            os.unlink(os.path.join(tmpfs, "fill"))
        except OSError:
            pass
        r.fill += 1
        r.save_state()
        fault("unfill")


def analyze(T):
    cfg = json.load(open(os.path.join(T, "cfg.json")))
    faults = []
    if os.path.exists(os.path.join(T, "faults.log")):
        for ln in open(os.path.join(T, "faults.log")):
            t, what = ln.split(" ", 1)
            faults.append((float(t), what.strip()))
    tampered = tampered_keys(T)
    kv = cfg["kv"]                 # chunk index -> key
    refs = {}                      # (combo, mode, missing tuple) -> sha

    def ref(c, mode, missing):
        key = (c, mode, missing)
        if key in refs:
            return refs[key]
        d = os.path.join(T, "ref", "%d-%s-%s" % (c, mode, "_".join(map(str, missing)) or "none"))
        subprocess.run(["rm", "-rf", d])
        subprocess.run([cfg["store"], "--store", d, "init", "--tier", "main=%s/t" % d], check=True, capture_output=True)
        put = [os.path.join(T, "kvs", kv[i] + ".kv") for i in cfg["combos"][c] if i not in missing]
        if put:
            subprocess.run([cfg["store"], "--store", d, "put"] + put, check=True, capture_output=True)
        lg = d + ".logits"
        subprocess.run([cfg["run"]] + cfg["run_args"] + ["--store", d, "--chunks", os.path.join(T, "combo-%d.jsonl" % c),
                        "--mode", mode, "-p", cfg["questions"][c], "--no-store-write", "--logits-out", lg],
                       check=True, capture_output=True)
        out = subprocess.run(["sha256sum", lg], check=True, capture_output=True, text=True).stdout.split()[0]
        refs[key] = out
        return out

    def near(t0, t1):
        return [w for t, w in faults if t0 - 1 <= t <= t1 + 0.5]

    n = {"answers": 0, "recomputed": 0, "cached": 0, "healed": 0, "healed_seen": False, "corrupt": 0, "hangs": 0,
         "crashes": 0, "killed": 0, "pre": 0, "exits": {}}
    bad = []
    for ln in open(os.path.join(T, "runs.log")):
        # host kind combo mode rc ms t0 t1 sha missing n_chunks healed errfile
        f = ln.split()
        host, kind, c, mode, rc, ms, t0, t1 = f[0], f[1], int(f[2]), f[3], int(f[4]), int(f[5]), float(f[6]), float(f[7])
        if rc == 124 or ms >= cfg["hang_s"] * 1000:
            n["hangs"] += 1
            bad.append("hang: %s %s (combo %d %s) ran %d ms (exit %d); faults then: %s; stderr %s"
                       % (host, kind, c, mode, ms, rc, near(t0, t1), f[-1]))
            continue
        if rc == 137:
            n["killed"] += 1
            continue
        if rc > 128:
            n["crashes"] += 1
            bad.append("crash: %s %s exited %d; faults then: %s; stderr %s" % (host, kind, rc, near(t0, t1), f[-1]))
            continue
        n["exits"][rc] = n["exits"].get(rc, 0) + 1
        if kind == "pre":
            n["pre"] += 1
        if kind != "run" or rc != 0:
            continue
        sha, missing, nch, healed = f[8], int(f[9]), int(f[10]), f[11]
        n["answers"] += 1
        n["recomputed"] += missing
        n["cached"] += nch - missing
        if healed != "-":
            n["healed_seen"] = True
            n["healed"] += int(healed)
        combo = cfg["combos"][c]
        # the answer's logits equal those of a clean store missing the same number of this
        # combination's chunks (which ones, the stats do not say: any subset of that size)
        subsets = [tuple(s) for s in subsets_of(list(combo), missing)]
        if not any(ref(c, mode, s) == sha for s in subsets):
            n["corrupt"] += 1
            bad.append("corrupt read: %s cb-run --mode %s on combination %d (%d of %d chunks computed) gave logits %s, "
                       "no clean store with %d missing gives them; faults then: %s; stderr %s"
                       % (host, mode, c, missing, nch, sha[:16], missing, near(t0, t1), f[-1]))
    # acknowledged entries
    lost_local, lost_shared, n_local, n_shared = [], [], 0, 0
    final = cfg_state(T)
    readable_, unreadable_ = set(), set()
    present = {}
    for h in cfg["hosts"]:
        present[h] = set(open(os.path.join(T, "final-ls-%s" % h)).read().split())

    why = {}
    probe = os.path.join(T, "probe", "store.json")
    g = json.load(open(probe))
    g["shared"] = dict(json.load(open(os.path.join(T, cfg["hosts"][0], "store.json")))["shared"])
    g["shared"]["url"] = "redis://127.0.0.1:%d/0" % Redis(T).c["port"]
    g["shared"]["timeout_ms"] = 5000
    json.dump(g, open(probe, "w"))

    def readable(k):   # by a host whose local tier is empty: from the shared tier, its MACs verified
        p = subprocess.run([cfg["store"], "--store", os.path.join(T, "probe"), "get", k, "-o", os.path.join(T, "probe.kv")],
                           capture_output=True, text=True)
        if p.returncode != 0:   # what Redis holds of it
            try:
                rc = Redis(T)
                r = Resp(rc.c["sock"], rc.c["password"])
                sid = json.load(open(os.path.join(T, cfg["hosts"][0], "store.json")))["shared"]["id"]
                m, v = "cb:{%s:%s}:m" % (sid, k), "cb:{%s:%s}:v" % (sid, k)
                held = "meta %s, value %s (%s parts), in the LRU set: %s" % (
                    r.cmd(b"TYPE", m).decode(), r.cmd(b"TYPE", v).decode(), r.cmd(b"LLEN", v),
                    r.cmd(b"ZSCORE", "cb:%s:lru" % sid, k) is not None)
            except (OSError, RuntimeError, AttributeError) as e:
                held = "Redis not asked (%s)" % e
            why[k] = "cb-store get: exit %d, %s; Redis: %s" % (p.returncode, p.stderr.strip().replace("\n", " / "), held)
        return p.returncode == 0
    acks = [ln.split() for ln in open(os.path.join(T, "acks.log"))]
    last_wipe = {}
    for i, a in enumerate(acks):
        if a[1] == "WIPE":
            last_wipe[a[0]] = i
    for i, a in enumerate(acks):
        # host key rc warn state0 state1, or host WIPE: the host's local tier emptied
        if a[1] == "WIPE":
            continue
        h, k, rc, warn, s0, s1 = a[:6]
        g0, mode0, run0, fill0 = s0.split(":")
        tmpfs_host = h == cfg.get("tmpfs_host")
        if i > last_wipe.get(h, -1) and (not tmpfs_host or (s0.split(":")[3] == s1.split(":")[3] and int(fill0) % 2 == 0)):
            n_local += 1
            if k not in present[h]:
                lost_local.append("%s %s (cb-precompute exit %s)" % (h, k, rc))
    # the shared tier: before each restart and at the end, the chaos loop found each entry
    # shared_acks names whole in Redis (shared-checks.log); at the end, each of the last run's
    # is read by a host with an empty local tier too, its MACs verified
    checked = set()
    if os.path.exists(os.path.join(T, "shared-checks.log")):
        for ln in open(os.path.join(T, "shared-checks.log")):
            run, k, h, g, res = ln.split()
            checked.add((run, k))
            if res != "ok":
                lost_shared.append("%s %s (written in redis generation %s, run %s): %s" % (h, k, g, run, res))
    if final[1] in ("aof", "rdb"):
        for h, k, g in shared_acks(T, final[2], tampered):
            checked.add((final[2], k))
            if k in readable_:
                continue
            if k in unreadable_ or not readable(k):
                unreadable_.add(k)
                lost_shared.append("%s %s (written in redis generation %s): %s" % (h, k, g, why.get(k, "")))
            else:
                readable_.add(k)
    n_shared = len(checked)

    print("# answers given: %d (cb-run exit 0), of which %d chunks loaded from a cache, %d recomputed"
          % (n["answers"], n["cached"], n["recomputed"]))
    print("# entries healed: %s" % (n["healed"] if n["healed_seen"] else "n/a (--stats reports no healed count)"))
    print("# cb-precompute runs completed: %d; commands killed by the chaos: %d; exit codes of the others: %s"
          % (n["pre"], n["killed"], " ".join("%d:%d" % kv_ for kv_ in sorted(n["exits"].items()))))
    fc = {}
    for _, w in faults:
        a = w.split()[0]
        fc[a] = fc.get(a, 0) + 1
    print("# faults injected: %s" % (", ".join("%s %d" % x for x in sorted(fc.items())) or "none"))
    print("# acknowledged entries checked: %d local, %d shared (written while Redis persisted, not tampered with)"
          % (n_local, n_shared))
    for b in bad[:20]:
        print("# " + b)
    for x in lost_local[:10]:
        print("# lost local entry: " + x)
    for x in lost_shared[:10]:
        print("# lost shared entry: " + x)
    tap = [("no corrupt read (%d answers checked against clean references)" % n["answers"], n["corrupt"] == 0,
            "%d corrupt reads" % n["corrupt"]),
           ("no hang (every command within %d s)" % cfg["hang_s"], n["hangs"] == 0, "%d hangs" % n["hangs"]),
           ("no crash (no command died of a signal the chaos did not send)", n["crashes"] == 0,
            "%d crashes" % n["crashes"]),
           ("no acknowledged entry lost (%d local, %d shared)" % (n_local, n_shared),
            not lost_local and not lost_shared, "%d local and %d shared entries lost" % (len(lost_local), len(lost_shared)))]
    with open(os.path.join(T, "tap"), "w") as f:
        for name, good, why in tap:
            f.write("%s\t%s\n" % ("ok" if good else "not_ok", name if good else name + ": " + why))
    print("# corrupt reads: %d, hangs: %d, crashes: %d, lost acknowledged entries: %d"
          % (n["corrupt"], n["hangs"], n["crashes"], len(lost_local) + len(lost_shared)))


def cfg_state(T):
    return open(os.path.join(T, "state")).read().split()[0].split(":")


def subsets_of(items, k):
    if k == 0:
        return [[]]
    if k > len(items):
        return []
    out = []
    for i, x in enumerate(items):
        for rest in subsets_of(items[i + 1:], k - 1):
            out.append([x] + rest)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "proxy":
        proxy(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "start":
        start(*sys.argv[2:8])
    elif sys.argv[1] == "chaos":
        chaos(sys.argv[2], float(sys.argv[3]), sys.argv[4].split(), sys.argv[5])
    elif sys.argv[1] == "analyze":
        analyze(sys.argv[2])
