/* remote_heal.c - the shared tier (remote.c) mends itself: an entry whose
 * keys are not the shape a put makes (its value list missing, cut short or
 * of another Redis type, its metadata no hash or with sizes no put writes)
 * is found by one script and dropped where this handle may write, so that
 * the next put of the chunk replaces it; and the tier's id is registered
 * again where Redis lost it (a restart without persistence, the key
 * deleted), so that stores made afterwards join it instead of starting a
 * tier of their own. */
#include "remote_impl.h"

#include <stdio.h>
#include <string.h>

/* KEYS: meta, value, lru, used; ARGV: key, checksum ('' any), drop ('1'),
 * the most bytes an entry may have.  {1, why} when the entry's keys are
 * not what a commit leaves (dropped when drop), {0, ''} when they are, or
 * when there is no entry (evicted or dropped meanwhile), or another one
 * than checksum's.  A dropped entry's bytes leave the accounting as its
 * commit counted them: its metadata's where they are believable, else its
 * parts' (65536: ST_MAX_PARTS).  Only commands of the writer's ACL in
 * cb-store(5) (a key of another type is told by a command failing on it,
 * in pcall). */
static const char LUA_INSPECT[] =
    "local c = redis.pcall('HGET', KEYS[1], 'checksum')\n"
    "local n = redis.pcall('LLEN', KEYS[2])\n"
    "local mbad = type(c) == 'table' local vbad = type(n) == 'table'\n"
    "local why = nil local b = nil\n"
    "if mbad then why = 'its metadata is not a hash'\n"
    "elseif not c then\n"
    "  if redis.call('EXISTS', KEYS[1]) == 1 then why = 'its metadata is malformed (no checksum)'\n"
    "  elseif vbad or n > 0 then why = 'its value has no metadata'\n"
    "  else return {0, ''} end\n"
    "else\n"
    "  if ARGV[2] ~= '' and c ~= ARGV[2] then return {0, ''} end\n"
    "  local sb = redis.call('HGET', KEYS[1], 'bytes') local sp = redis.call('HGET', KEYS[1], 'parts')\n"
    "  b = tonumber(sb or '') local p = tonumber(sp or '')\n"
    "  if not b or not p or b < 1 or p < 1 or p > b or p > 65536 or b > tonumber(ARGV[4]) then\n"
    "    why = 'its metadata is malformed (bytes ' .. tostring(sb) .. ', parts ' .. tostring(sp) .. ')'\n"
    "    b = nil\n"
    "  elseif vbad then why = 'its value is not a list'\n"
    "  elseif n == 0 then why = 'its value is missing'\n"
    "  elseif n ~= p then why = 'its value has ' .. n .. ' parts, its metadata says ' .. p end\n"
    "end\n"
    "if not why then return {0, ''} end\n"
    "if ARGV[3] == '1' then\n"
    "  if not b and not vbad then\n"
    "    b = 0\n"
    "    for i = 0, n - 1 do b = b + string.len(redis.call('LINDEX', KEYS[2], i)) end\n"
    "  end\n"
    "  local counted = redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "  redis.call('DEL', KEYS[1], KEYS[2])\n"
    "  local u = tonumber(redis.call('GET', KEYS[4]) or '0') or 0\n"
    "  if counted == 1 and b and b <= u then redis.call('SET', KEYS[4], u - b) end\n"
    "end\n"
    "return {1, why}\n";

/* KEYS: the tier's name key; ARGV: its id.  1 registered now (it was
 * missing), 0 there already, else the id Redis holds. */
static const char LUA_REGISTER[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v then redis.call('SET', KEYS[1], ARGV[1]) return 1 end\n"
    "if v == ARGV[1] then return 0 end\n"
    "return v\n";

/* The most bytes an entry of r may have: its capacity, else what
 * ST_MAX_PARTS parts of 1 MB hold. */
static uint64_t max_bytes(const st_remote *r) { return r->cap ? r->cap : ST_MAX_BYTES; }

int st_remote_inspect(cb_store *s, const char *key, const char *checksum, int drop, char *why,
                      size_t why_n)
{
    st_remote *r = &s->remote;
    rkeys k;
    char max[32];
    why[0] = 0;
    if (!st_remote_up(s))
        return -1;
    drop = drop && !s->readonly && !r->ro;
    st_remote_keys(s, key, &k);
    snprintf(max, sizeof max, "%llu", (unsigned long long)max_bytes(r));
    const char *argv[] = {
        "EVAL",           LUA_INSPECT, "4", k.m, k.v, k.lru, k.used, key, checksum ? checksum : "",
        drop ? "1" : "0", max};
    r->quiet = 1; /* a user that may not write: reported by the put that needs it */
    redisReply *rep = st_remote_cmd_argv(s, 11, argv, NULL);
    r->quiet = 0;
    if (!rep && r->ro && r->ctx && drop) { /* NOPERM: looked at without dropping */
        argv[9] = "0";
        drop = 0;
        rep = st_remote_cmd_argv(s, 11, argv, NULL);
    }
    if (!rep) /* a user that may not run scripts cannot look: nothing known */
        return r->ctx ? 0 : -1;
    int bad = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
              rep->element[0]->type == REDIS_REPLY_INTEGER && rep->element[0]->integer == 1;
    if (bad) {
        snprintf(why, why_n, "%s",
                 rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "malformed");
        if (drop)
            s->n_healed[s->n_tiers]++;
    }
    freeReplyObject(rep);
    return bad ? 1 + drop : 0;
}

int st_remote_heal(cb_store *s, const char *key, const char *checksum, const char *then)
{
    st_remote *r = &s->remote;
    char why[300];
    int rc = st_remote_inspect(s, key, checksum, 1, why, sizeof why);
    if (rc == 2)
        st_remote_warn(s, "shared tier %s: %s: %s; dropped (%s)", r->name, key, why, then);
    else if (rc == 1)
        st_remote_warn(s, "shared tier %s: %s: %s; not dropped (%s): %s", r->name, key, why,
                       s->readonly ? "the store is read-only" : "this user may not write", then);
    return rc;
}

int st_remote_sound(cb_store *s, const char *key)
{
    int have = st_remote_has(s, key);
    if (have != 1)
        return have;
    int rc = st_remote_heal(s, key, NULL, "written again");
    return rc < 0 ? -1 : rc == 0;
}

void st_remote_register(cb_store *s)
{
    st_remote *r = &s->remote;
    char name[64];
    if (!r->id[0] || s->readonly)
        return;
    snprintf(name, sizeof name, "cb:tier:%s", r->name);
    const char *argv[] = {"EVAL", LUA_REGISTER, "1", name, r->id};
    r->quiet = 1; /* a read-only user cannot: the put that needs it says so */
    redisReply *rep = st_remote_cmd_argv(s, 5, argv, NULL);
    r->quiet = 0;
    if (!rep)
        return;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1)
        st_remote_warn(s,
                       "shared tier %s: its id was missing from Redis (a restart without "
                       "persistence, or %s deleted); registered again as %s",
                       r->name, name, r->id);
    else if (rep->type == REDIS_REPLY_STRING && !s->id_warned++)
        st_remote_warn(s,
                       "shared tier %s: Redis names its id %.32s, this store's is %s: stores made "
                       "with the other share nothing with this one (give them one id in "
                       "store.json)",
                       r->name, rep->str, r->id);
    freeReplyObject(rep);
}
