/* test_chat.c - chat templates: detection on real template text (the default
 * model's, and templates of Llama 3, Mistral, Llama 2 and Gemma quoted
 * below), and prefix + "Hello" + suffix against renderings written out by
 * hand from llama.cpp's llm_chat_apply_template (src/llama-chat.cpp). */
#include "../../lib/infer/infer.h"
#include "test.h"

static cb_strview sv(const char *s)
{
    cb_strview v = {s, s ? strlen(s) : 0};
    return v;
}

/* ------------------------------------------------------------ templates */

/* meta-llama/Meta-Llama-3-8B-Instruct (tokenizer_config.json, unescaped) */
static const char tmpl_llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content "
    "%}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/* mistralai/Mistral-7B-Instruct-v0.1 */
static const char tmpl_mistral[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' "
    "%}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user "
    "and assistant roles are supported!') }}{% endif %}{% endfor %}";

/* meta-llama/Llama-2-7b-chat-hf (abridged: the system block and the turns) */
static const char tmpl_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages "
    "%}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
    "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* google/gemma-7b-it */
static const char tmpl_gemma[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System "
    "role not supported') }}{% endif %}{% for message in messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else "
    "%}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

/* Qwen/Qwen2-0.5B-Instruct */
static const char tmpl_qwen2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' "
    "%}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% "
    "endif %}";

/* Templates llama.cpp files under kinds this library does not render. */
static const char *const tmpl_others[] = {
    /* phi-4: chatml markers plus <|im_sep|> */
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endfor %}",
    /* zephyr: checked before gemma in llama.cpp, so it wins over <start_of_turn> */
    "{% for message in messages %}{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' "
    "}}{% endfor %}<start_of_turn>",
    /* phi-3 */
    "{{ '<|user|>\\n' + message['content'] + '<|end|>\\n<|assistant|>\\n' }}",
    /* command-r before llama3's test */
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|start_header_id|><|end_header_id|>",
    /* nothing known */
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' "
    "}}{% endfor %}",
    "<|start_header_id|> alone",
    "plain text",
};

/* ---------------------------------------------------------------- tests */

static void test_detect(void)
{
    const char *model = t_smol_model();
    tcase("detect: llama3, mistral, llama2, gemma, qwen2 templates");
    CHECK(cb_chat_detect(sv(tmpl_llama3)) == CB_CHAT_LLAMA3);
    CHECK(cb_chat_detect(sv(tmpl_mistral)) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv(tmpl_llama2)) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv(tmpl_gemma)) == CB_CHAT_GEMMA);
    CHECK(cb_chat_detect(sv(tmpl_qwen2)) == CB_CHAT_CHATML);

    tcase("detect: llama.cpp's template names and the first-match order");
    CHECK(cb_chat_detect(sv("chatml")) == CB_CHAT_CHATML);
    CHECK(cb_chat_detect(sv("llama3")) == CB_CHAT_LLAMA3);
    CHECK(cb_chat_detect(sv("gemma")) == CB_CHAT_GEMMA);
    CHECK(cb_chat_detect(sv("llama2")) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv("llama2-sys-strip")) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv("mistral-v7")) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv("phi3")) == CB_CHAT_NONE);
    /* chatml is tested first, then [INST], then gemma, then llama3 */
    CHECK(cb_chat_detect(sv("[INST] <|im_start|>")) == CB_CHAT_CHATML);
    CHECK(cb_chat_detect(sv("<start_of_turn> [INST]")) == CB_CHAT_MISTRAL);
    CHECK(cb_chat_detect(sv("<|start_header_id|><|end_header_id|><start_of_turn>")) ==
          CB_CHAT_GEMMA);
    for (int k = CB_CHAT_NONE; k <= CB_CHAT_GEMMA; k++)
        CHECKF(cb_chat_detect(sv(cb_chat_name((cb_chat_kind)k))) == (cb_chat_kind)k, "name %s",
               cb_chat_name((cb_chat_kind)k));

    tcase("detect: unknown, empty and other kinds give none");
    for (size_t i = 0; i < sizeof tmpl_others / sizeof *tmpl_others; i++)
        CHECKF(cb_chat_detect(sv(tmpl_others[i])) == CB_CHAT_NONE, "other %zu", i);
    CHECK(cb_chat_detect(sv("")) == CB_CHAT_NONE);
    CHECK(cb_chat_detect(sv(NULL)) == CB_CHAT_NONE);

    tcase("detect: the view's length bounds the search");
    {
        static const char buf[] = "{{ message }}<|im_start|>";
        cb_strview v = {buf, 13}; /* stops before the marker */
        cb_strview w = {"chatml-not", 6};
        cb_strview x = {"<|im_start|>", 11}; /* one byte short */
        CHECK(cb_chat_detect(v) == CB_CHAT_NONE);
        CHECK(cb_chat_detect(w) == CB_CHAT_CHATML);
        CHECK(cb_chat_detect(x) == CB_CHAT_NONE);
    }

    if (!model) {
        tskip("detect: the default model's template (SmolLM2) is chatml",
              "default model not downloaded");
    } else {
        cb_gguf *g = NULL;
        cb_error err = {0};
        tcase("detect: the default model's template (SmolLM2) is chatml");
        CHECK_OK(cb_gguf_open(&g, model, &err));
        if (g) {
            cb_strview t = cb_gguf_str(g, "tokenizer.chat_template");
            CHECK(t.len > 0);
            CHECK(cb_chat_detect(t) == CB_CHAT_CHATML);
        }
        cb_gguf_free(g);
    }
}

static void test_names(void)
{
    tcase("default system: the constant a chatml template writes when none is given");
    {
        char *d = cb_chat_default_system(sv(tmpl_qwen2));
        CHECK(d && strcmp(d, "You are a helpful assistant.") == 0);
        free(d);
        /* Qwen2.5's: a tools branch first (an expression), then the constant */
        d = cb_chat_default_system(
            sv("{%- if tools %}{{- '<|im_start|>system\\n' }}{{- messages[0]['content'] }}"
               "{%- else %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
               "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, "
               "created by Alibaba Cloud.\\nBe helpful.<|im_end|>\\n' }}"));
        CHECK(d && strcmp(d, "You are Qwen, created by Alibaba Cloud.\nBe helpful.") == 0);
        free(d);
        /* SmolLM2's newlines are written as they are */
        d = cb_chat_default_system(sv("{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}"));
        CHECK(d && strcmp(d, "You are SmolLM") == 0);
        free(d);
        CHECK(cb_chat_default_system(sv(tmpl_llama3)) == NULL);
        CHECK(cb_chat_default_system(sv("{{ '<|im_start|>system\\n' + x + '<|im_end|>\\n' }}")) ==
              NULL);
        CHECK(cb_chat_default_system(sv("{{ '<|im_start|>system\\nA \\t tab<|im_end|>\\n' }}")) ==
              NULL);
        CHECK(cb_chat_default_system(sv("{{ '<|im_start|>system\\nunterminated")) == NULL);
        CHECK(cb_chat_default_system(sv("{{ '<|im_start|>system\\n<|im_end|>\\n' }}")) == NULL);
        CHECK(cb_chat_default_system(sv("")) == NULL);
        cb_strview cut = sv(tmpl_qwen2); /* the view's length bounds the search */
        cut.len = (size_t)(strstr(tmpl_qwen2, "<|im_end|>") - tmpl_qwen2);
        CHECK(cb_chat_default_system(cut) == NULL);
    }

    tcase("names");
    CHECK(strcmp(cb_chat_name(CB_CHAT_NONE), "none") == 0);
    CHECK(strcmp(cb_chat_name(CB_CHAT_CHATML), "chatml") == 0);
    CHECK(strcmp(cb_chat_name(CB_CHAT_LLAMA3), "llama3") == 0);
    CHECK(strcmp(cb_chat_name(CB_CHAT_MISTRAL), "mistral") == 0);
    CHECK(strcmp(cb_chat_name(CB_CHAT_GEMMA), "gemma") == 0);
    CHECK(cb_chat_name((cb_chat_kind)42) != NULL);
}

/* prefix + "Hello" + suffix == want */
static void check_render(cb_chat_kind k, const char *system, const char *want)
{
    cb_chat_parts parts = {NULL, NULL};
    cb_status st = cb_chat_render(k, system, &parts);
    CHECKF(st == CB_OK, "%s: status %d", cb_chat_name(k), (int)st);
    if (st == CB_OK) {
        size_t n = strlen(parts.prefix) + 5 + strlen(parts.suffix);
        char *got = malloc(n + 1);
        snprintf(got, n + 1, "%sHello%s", parts.prefix, parts.suffix);
        CHECKF(strcmp(got, want) == 0, "%s, system %s%s%s:\n#     got  [%s]\n#     want [%s]",
               cb_chat_name(k), system ? "\"" : "", system ? system : "NULL", system ? "\"" : "",
               got, want);
        free(got);
    }
    cb_chat_parts_free(&parts);
    CHECK(parts.prefix == NULL && parts.suffix == NULL);
}

static void test_render(void)
{
    tcase("render chatml");
    check_render(CB_CHAT_CHATML, NULL,
                 "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    check_render(CB_CHAT_CHATML, "", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    check_render(CB_CHAT_CHATML, "You are a bot.",
                 "<|im_start|>system\nYou are a bot.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    check_render(CB_CHAT_CHATML, " keep spaces\n", /* chatml does not trim */
                 "<|im_start|>system\n keep spaces\n<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");

    tcase("render llama3");
    check_render(CB_CHAT_LLAMA3, NULL,
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(CB_CHAT_LLAMA3, "You are a bot.",
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(CB_CHAT_LLAMA3, "\n  You are a bot. \t", /* trimmed */
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");

    tcase("render mistral (llama.cpp's llama2 variant)");
    check_render(CB_CHAT_MISTRAL, NULL, "[INST] Hello [/INST]");
    check_render(CB_CHAT_MISTRAL, "You are a bot.", "[INST] You are a bot.\nHello [/INST]");

    tcase("render gemma (system merged into the user turn)");
    check_render(CB_CHAT_GEMMA, NULL,
                 "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
    check_render(CB_CHAT_GEMMA, "You are a bot.",
                 "<start_of_turn>user\nYou are a bot.\n\nHello<end_of_turn>\n"
                 "<start_of_turn>model\n");
    check_render(CB_CHAT_GEMMA, " You are a bot.\n",
                 "<start_of_turn>user\nYou are a bot.\n\nHello<end_of_turn>\n"
                 "<start_of_turn>model\n");
    check_render(CB_CHAT_GEMMA, " \n ", /* trims to nothing: no system text */
                 "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");

    tcase("render: none and unknown kinds are invalid, output untouched");
    {
        char a = 'a', b = 'b';
        cb_chat_parts parts = {&a, &b};
        CHECK(cb_chat_render(CB_CHAT_NONE, NULL, &parts) == CB_ERR_INVALID);
        CHECK(cb_chat_render(CB_CHAT_NONE, "sys", &parts) == CB_ERR_INVALID);
        CHECK(cb_chat_render((cb_chat_kind)42, NULL, &parts) == CB_ERR_INVALID);
        CHECK(parts.prefix == &a && parts.suffix == &b);
        CHECK(cb_chat_render(CB_CHAT_CHATML, NULL, NULL) == CB_ERR_INVALID);
        cb_chat_parts_free(NULL);
    }
}

int main(void)
{
    TEST_BEGIN();
    test_detect();
    test_names();
    test_render();
    TEST_END();
}
