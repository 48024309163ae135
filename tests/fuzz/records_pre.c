/* records_pre.c - cb-precompute's record pass-through (emit), compiled from
 * src/cb-precompute.c itself; part of fuzz_records. */
#define main cb_precompute_main
#include "../../src/cb-precompute.c"
#undef main

#include "fuzz.h"

/* One line (no newline) as cb-precompute's main loop reads it: a record is
 * a JSON object with a "text" string (the same tests as main's).  For a
 * record, emit() writes it to stdout with kv and cached added; the caller
 * has pointed stdout at a file, and reads back what was written.  Returns 1
 * for a record, 0 for a line cb-precompute reports as bad. */
int fuzz_precompute_record(const char *line, size_t len, const char *key, int cached)
{
    json_error_t jerr;
    json_t *obj = json_loadb(line, len, 0, &jerr);
    json_t *text = obj ? json_object_get(obj, "text") : NULL;
    if (!obj || !json_is_object(obj) || !json_is_string(text)) {
        json_decref(obj);
        return 0;
    }
    FUZZ_CHECK(emit(line, len, obj, key, cached) == 0);
    json_decref(obj);
    return 1;
}
