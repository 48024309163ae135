/* chat.c - the built-in chat templates: recognising a GGUF's
 * tokenizer.chat_template and rendering one system + user exchange.
 *
 * Both follow llama.cpp's src/llama-chat.cpp: detection is
 * llm_chat_detect_template's chain of substring tests, and rendering is
 * llm_chat_apply_template's output for [system,] user with add_ass (the
 * generation prompt).  llama.cpp knows some forty templates; this file
 * renders four.  A template that llama.cpp files under another kind, even
 * one that also contains our markers (phi-4's "<|im_start|>...<|im_sep|>",
 * zephyr's "<|user|>...<|endoftext|>" before gemma's test), is
 * CB_CHAT_NONE, so that nothing is rendered in a format the model was not
 * trained on.
 *
 * The [INST] family: llama.cpp splits it into llama2 (and its -sys, -sys-bos,
 * -sys-strip variants) and mistral-v1/v3/v3-tekken/v7, which differ in
 * spaces and in how the system prompt is written.  CB_CHAT_MISTRAL is
 * detected for all of them but renders one: LLM_CHAT_TEMPLATE_LLAMA_2, what
 * llama.cpp picks for a template that contains "[INST]" and none of the
 * marks of the others (no "<<SYS>>", "[SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]",
 * "' [INST] ' + system_message", "bos_token + '[INST]", "content.strip()"):
 *     [INST] {system}\n{user} [/INST]
 * with the system line (content + "\n", no <<SYS>> block) only when given.
 *
 * User text: llama.cpp trims the message content for llama3 and gemma.  The
 * user text goes between prefix and suffix untouched here (the caller
 * tokenizes it, or splices cached chunks), so a caller that wants the exact
 * llama.cpp rendering passes it trimmed.  The system text is ours and is
 * trimmed where llama.cpp trims it. */
#include "infer.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ detection */

static int has(cb_strview t, const char *needle)
{
    size_t n = strlen(needle);
    if (n == 0)
        return 1;
    if (t.len < n)
        return 0;
    for (size_t i = 0; i + n <= t.len; i++)
        if (t.data[i] == needle[0] && memcmp(t.data + i, needle, n) == 0)
            return 1;
    return 0;
}

static int starts(cb_strview t, const char *prefix)
{
    size_t n = strlen(prefix);
    return t.len >= n && memcmp(t.data, prefix, n) == 0;
}

/* Template names llama.cpp accepts in place of a template, for our kinds
 * (names starting with "mistral" are caught by the [INST] test below). */
static const struct {
    const char *name;
    cb_chat_kind kind;
} chat_names[] = {
    {"chatml", CB_CHAT_CHATML},
    {"llama3", CB_CHAT_LLAMA3},
    {"gemma", CB_CHAT_GEMMA},
    {"llama2", CB_CHAT_MISTRAL},
    {"llama2-sys", CB_CHAT_MISTRAL},
    {"llama2-sys-bos", CB_CHAT_MISTRAL},
    {"llama2-sys-strip", CB_CHAT_MISTRAL},
};

/* Returns the kind llama.cpp's llm_chat_detect_template would choose, when
 * it is one of ours; CB_CHAT_NONE for an empty or NULL view, an unknown
 * template, or one llama.cpp gives another kind.  The tests run in
 * llama.cpp's order up to its llama3 test; later ones cannot change the
 * answer. */
cb_chat_kind cb_chat_detect(cb_strview t)
{
    if (!t.data || t.len == 0)
        return CB_CHAT_NONE;
    for (size_t i = 0; i < sizeof chat_names / sizeof *chat_names; i++)
        if (cb_strview_eq(t, chat_names[i].name))
            return chat_names[i].kind;

    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>") || has(t, "<end_of_utterance>"))
            return CB_CHAT_NONE; /* phi4, smolvlm */
        return CB_CHAT_CHATML;
    }
    if (starts(t, "mistral") || has(t, "[INST]"))
        return CB_CHAT_MISTRAL;
    /* phi3, chatglm4, falcon3/glmedge, glmedge, zephyr, monarch */
    if ((has(t, "<|assistant|>") && has(t, "<|end|>")) || has(t, "[gMASK]<sop>") ||
        (has(t, "<|assistant|>") && has(t, "<|user|>")) ||
        (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>")) ||
        (has(t, "<|user|>") && has(t, "<|endoftext|>")) || has(t, "bos_token + message['role']"))
        return CB_CHAT_NONE;
    if (has(t, "<start_of_turn>"))
        return CB_CHAT_GEMMA;
    /* orion, openchat, vicuna, deepseek, command-r */
    if (has(t, "'\\n\\nAssistant: ' + eos_token") || has(t, "GPT4 Correct ") ||
        (has(t, "USER: ") && has(t, "ASSISTANT: ")) ||
        (has(t, "### Instruction:") && has(t, "<|EOT|>")) ||
        (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>")))
        return CB_CHAT_NONE;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        return CB_CHAT_LLAMA3;
    return CB_CHAT_NONE;
}

/* "none", "chatml", "llama3", "mistral", "gemma"; "unknown" for a value
 * outside the enum.  cb_chat_detect(name) gives the kind back. */
const char *cb_chat_name(cb_chat_kind k)
{
    switch (k) {
    case CB_CHAT_NONE: return "none";
    case CB_CHAT_CHATML: return "chatml";
    case CB_CHAT_LLAMA3: return "llama3";
    case CB_CHAT_MISTRAL: return "mistral";
    case CB_CHAT_GEMMA: return "gemma";
    }
    return "unknown";
}

/* ------------------------------------------------------- default system */

/* The system message a chatml template writes when the conversation has
 * none: the constant in '<|im_start|>system\n' TEXT '<|im_end|>\n' (Qwen2.5:
 * "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
 * SmolLM2's writes its newlines as they are, not as \n).  Jinja's \n
 * escapes become newlines; a literal holding another escape, a quote or an
 * expression's '+', '{' or '}' is not a constant. */

/* The length of the newline at s (a newline, or Jinja's \n), else 0. */
static size_t newline_at(const char *s, const char *end)
{
    if (s < end && *s == '\n')
        return 1;
    return end - s >= 2 && s[0] == '\\' && s[1] == 'n' ? 2 : 0;
}

char *cb_chat_default_system(cb_strview t)
{
    static const char open[] = "'<|im_start|>system", close[] = "<|im_end|>";
    const size_t no = sizeof open - 1, nc = sizeof close - 1;
    const char *end = t.data + t.len;

    for (const char *at = t.data; at && end - at >= (ptrdiff_t)no; at++) {
        const char *a, *e;
        size_t nl;
        if (memcmp(at, open, no) != 0 || !(nl = newline_at(at + no, end)))
            continue;
        a = at + no + nl;
        for (e = a; e < end && !(end - e >= (ptrdiff_t)nc && memcmp(e, close, nc) == 0); e++)
            if (*e == '\'' || *e == '+' || *e == '{' || *e == '}')
                break;
        if (e == a || end - e < (ptrdiff_t)nc || memcmp(e, close, nc) != 0 ||
            !(nl = newline_at(e + nc, end)) || e + nc + nl >= end || e[nc + nl] != '\'')
            continue;
        char *s = malloc((size_t)(e - a) + 1), *o = s;
        if (!s)
            return NULL;
        for (const char *c = a; c < e; c++) {
            if (*c != '\\') {
                *o++ = *c;
            } else if (newline_at(c, e) == 2) {
                *o++ = '\n', c++;
            } else {
                o = NULL;
                break;
            }
        }
        if (o) {
            *o = 0;
            return s;
        }
        free(s);
    }
    return NULL;
}

/* ------------------------------------------------------------ rendering */

/* malloc'd a + mid[0..nmid) + b. */
static char *concat(const char *a, const char *mid, size_t nmid, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nmid + nb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, na);
    memcpy(s + na, mid, nmid);
    memcpy(s + na + nmid, b, nb + 1);
    return s;
}

/* llama.cpp's trim(): isspace in the C locale. */
static int is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

static const char *trim(const char *s, size_t *len)
{
    size_t n = strlen(s);
    while (n > 0 && is_space(*s))
        s++, n--;
    while (n > 0 && is_space(s[n - 1]))
        n--;
    *len = n;
    return s;
}

/* Fills *out with malloc'd prefix and suffix (see cbcore.h); out is left
 * alone on error.  system NULL or "" means no system message; for gemma a
 * system text that trims to nothing is dropped too, as llama.cpp does. */
cb_status cb_chat_render(cb_chat_kind k, const char *system, cb_chat_parts *out)
{
    const char *sys = (system && *system) ? system : NULL, *st = NULL;
    /* prefix = head, or pre_sys + system + post_sys; suffix = tail */
    const char *head, *tail, *pre_sys, *post_sys;
    size_t sn = 0;
    char *prefix, *suffix;

    if (!out)
        return CB_ERR_INVALID;
    switch (k) {
    case CB_CHAT_CHATML:
        pre_sys = "<|im_start|>system\n";
        post_sys = "<|im_end|>\n<|im_start|>user\n";
        head = "<|im_start|>user\n";
        tail = "<|im_end|>\n<|im_start|>assistant\n";
        if (sys)
            st = sys, sn = strlen(sys);
        break;
    case CB_CHAT_LLAMA3:
        pre_sys = "<|start_header_id|>system<|end_header_id|>\n\n";
        post_sys = "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n";
        head = "<|start_header_id|>user<|end_header_id|>\n\n";
        tail = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        if (sys)
            st = trim(sys, &sn);
        break;
    case CB_CHAT_MISTRAL: /* llama2: see the top of the file */
        pre_sys = "[INST] ";
        post_sys = "\n";
        head = "[INST] ";
        tail = " [/INST]";
        if (sys)
            st = sys, sn = strlen(sys);
        break;
    case CB_CHAT_GEMMA: /* no system role: merged into the user turn */
        pre_sys = "<start_of_turn>user\n";
        post_sys = "\n\n";
        head = "<start_of_turn>user\n";
        tail = "<end_of_turn>\n<start_of_turn>model\n";
        if (sys) {
            st = trim(sys, &sn);
            if (sn == 0)
                st = NULL;
        }
        break;
    default: return CB_ERR_INVALID;
    }

    prefix = st ? concat(pre_sys, st, sn, post_sys) : concat(head, "", 0, "");
    suffix = concat(tail, "", 0, "");
    if (!prefix || !suffix) {
        free(prefix);
        free(suffix);
        return CB_ERR_NOMEM;
    }
    out->prefix = prefix;
    out->suffix = suffix;
    return CB_OK;
}

/* Frees both strings and sets them to NULL; accepts NULL and a zeroed
 * struct. */
void cb_chat_parts_free(cb_chat_parts *p)
{
    if (!p)
        return;
    free(p->prefix);
    free(p->suffix);
    p->prefix = NULL;
    p->suffix = NULL;
}
