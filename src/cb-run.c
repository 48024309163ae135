/* cb-run - run a model over a prompt.  This build has the tokenizer modes:
 *   cb-run --tokenize   [-m MODEL] [--special] [-p TEXT | -f FILE | stdin]
 *   cb-run --detokenize [-m MODEL] [--special] [-p IDS  | -f FILE | stdin]
 * Generation (and the blend modes) come with the inference engine. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cb-run --tokenize   [-m MODEL] [--special] [-p TEXT | -f FILE]\n"
            "       cb-run --detokenize [-m MODEL] [--special] [-p IDS | -f FILE]\n"
            "\n"
            "Tokenize text with the model's own tokenizer, or turn token ids back into text.\n"
            "Only the tokenizer is read, so vocabulary-only GGUF files work.\n"
            "\n"
            "  --tokenize         print the token ids of exactly the input bytes (no BOS or\n"
            "                     EOS) as one line of space-separated integers\n"
            "  --detokenize       read space-separated token ids and print their text\n"
            "  --special          tokenize: match control tokens (<|im_start|>, ...) in the\n"
            "                     text; detokenize: print control tokens as their text\n"
            "  -p, --prompt TEXT  the input on the command line\n"
            "  -f, --file FILE    the input from FILE ('-' for stdin; stdin is the default)\n"
            "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model in\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/models/)\n"
            "  -v, --verbose      print the tokenizer's facts on stderr\n"
            "  -q, --quiet        print nothing but errors\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "Exit status: 0 success, 64 usage error, 65 bad input data (malformed GGUF,\n"
            "unknown token id), 66 input missing, 70 internal error, 74 I/O error.\n");
}

enum { OPT_TOKENIZE = 256, OPT_DETOKENIZE, OPT_SPECIAL, OPT_VERSION };

/* Parse "12 7 99\n" into ids; a bad number is reported with its position. */
static int parse_ids(const char *text, size_t len, const char *name, int32_t n_vocab, cb_tokens *ids)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
            i++;
        if (i >= len)
            break;
        char *end;
        errno = 0;
        long long v = strtoll(text + i, &end, 10);
        size_t used = (size_t)(end - (text + i));
        if (used == 0 || errno != 0 ||
            (i + used < len && !(text[i + used] == ' ' || text[i + used] == '\t' || text[i + used] == '\n' ||
                                 text[i + used] == '\r'))) {
            cli_err("%s: byte %zu: not a token id: '%.20s'", name, i, text + i);
            return CLI_EX_DATAERR;
        }
        if (v < 0 || v >= n_vocab) {
            cli_err("%s: token id %lld is out of range (the vocabulary has %d tokens)", name, v, (int)n_vocab);
            return CLI_EX_DATAERR;
        }
        if (cb_tokens_push(ids, (int32_t)v) != CB_OK) {
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
        i += used;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokenize", no_argument, 0, OPT_TOKENIZE},
        {"detokenize", no_argument, 0, OPT_DETOKENIZE},
        {"special", no_argument, 0, OPT_SPECIAL},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"model", required_argument, 0, 'm'},
        {"verbose", no_argument, 0, 'v'},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, OPT_VERSION},
        {0, 0, 0, 0},
    };
    const char *model_opt = NULL, *prompt = NULL, *file = NULL;
    int mode = 0, special = 0, c, code = 0;
    cb_gguf *g = NULL;
    cb_vocab *v = NULL;
    cb_tokens ids = {0};
    cb_error err;
    char *input = NULL, *text = NULL;
    size_t len = 0, tlen = 0;

    cli_prog = "cb-run";
    while ((c = getopt_long(argc, argv, "p:f:m:vqh", opts, NULL)) != -1) {
        switch (c) {
        case OPT_TOKENIZE:
        case OPT_DETOKENIZE:
            if (mode && mode != c) {
                cli_err("--tokenize and --detokenize exclude each other");
                return CLI_EX_USAGE;
            }
            mode = c;
            break;
        case OPT_SPECIAL: special = 1; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'm': model_opt = optarg; break;
        case 'v': cli_verbosity = 2; break;
        case 'q': cli_verbosity = 0; break;
        case 'h': usage(stdout); return cli_finish(0);
        case OPT_VERSION: cli_version(); return cli_finish(0);
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("unexpected argument '%s'", argv[optind]);
        return CLI_EX_USAGE;
    }
    if (!mode) {
        cli_err("give --tokenize or --detokenize (generation is not part of this build)");
        usage(stderr);
        return CLI_EX_USAGE;
    }
    if (prompt && file) {
        cli_err("-p and -f exclude each other");
        return CLI_EX_USAGE;
    }

    const char *model = cli_model_path(model_opt);
    if (cb_gguf_open(&g, model, &err) != CB_OK) {
        cli_err("%s", err.msg);
        if (err.status == CB_ERR_NOT_FOUND && !model_opt && !getenv("CB_MODEL"))
            cli_err("the default model is fetched with 'make model'; or give -m PATH");
        return cli_exit_code(err.status);
    }
    if (cb_vocab_load(&v, g, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    cli_info("%s: %s tokenizer, pre-tokenizer %s, %d tokens", model,
             cb_vocab_kind_of(v) == CB_VOCAB_BPE ? "byte-level BPE" : "SentencePiece BPE", cb_vocab_pre(v),
             (int)cb_vocab_n_tokens(v));

    if (prompt) {
        input = strdup(prompt);
        len = strlen(prompt);
        if (!input) {
            cli_err("out of memory");
            code = CLI_EX_SOFTWARE;
            goto done;
        }
    } else if (!(input = cli_read_input(file, &len, &code))) {
        goto done;
    }
    const char *in_name = prompt ? "-p" : file && strcmp(file, "-") != 0 ? file : "(stdin)";

    if (mode == OPT_TOKENIZE) {
        cb_status st = cb_tok_encode(v, input, len, special ? CB_TOK_PARSE_SPECIAL : 0, &ids);
        if (st != CB_OK) {
            cli_err("%s: tokenizing failed: %s", in_name, cb_strerror(st));
            code = cli_exit_code(st);
            goto done;
        }
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", (int)ids.ids[i]);
        putchar('\n');
    } else {
        if ((code = parse_ids(input, len, in_name, cb_vocab_n_tokens(v), &ids)) != 0)
            goto done;
        cb_status st = cb_tok_decode(v, ids.ids, ids.n, special ? CB_DETOK_UNPARSE_SPECIAL : 0, &text, &tlen);
        if (st != CB_OK) {
            cli_err("%s: detokenizing failed: %s", in_name, cb_strerror(st));
            code = cli_exit_code(st);
            goto done;
        }
        fwrite(text, 1, tlen, stdout);
    }
    code = cli_finish(0);
done:
    free(text);
    free(input);
    cb_tokens_free(&ids);
    cb_vocab_free(v);
    cb_gguf_free(g);
    return code;
}
