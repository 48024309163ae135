#!/usr/bin/env python3
"""gen-golden-tokens.py - token ids from llama.cpp itself, for the tokenizer tests.

Uses llama-cpp-python (the llama.cpp library through ctypes), loading only the
vocabulary of a GGUF file.

usage:
  scripts/gen-golden-tokens.py [--model GGUF] [-o FILE]
      Tokenize the built-in texts with the model's vocabulary and write the
      golden file (default: tests/data/smollm2-golden.txt, model:
      $CB_MODEL or ~/.cache/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf).
      A vocabulary with Gemma's turn markers also gets GEMMA_TEXTS:
        scripts/gen-golden-tokens.py --model .../gemma-3-270m-q4_k_m.gguf \
            -o tests/data/gemma3-golden.txt
  scripts/gen-golden-tokens.py --vocab VOCAB.gguf [--inp FILE]
      Debugging: print llama.cpp's ids for each input of a conformance suite
      (VOCAB.gguf.inp by default) in the .out format, one line per input, to
      compare with VOCAB.gguf.out or with our output.
  scripts/gen-golden-tokens.py --model GGUF --text STRING [--special]
      Debugging: print the ids of one text.

Golden file format (text, one case per line, tab-separated fields):
  mode   "plain"   llama_tokenize(text, add_special=false, parse_special=false)
         "special" llama_tokenize(text, add_special=false, parse_special=true)
  text   the input, escaped: \\\\ \\t \\n \\r, and \\xHH (a byte) for other control
         characters and for the bytes of U+0085, U+2028 and U+2029
  ids    space-separated token ids
  detok  llama_detokenize(ids, remove_special=false, unparse_special=(mode == special)),
         escaped like text
Lines starting with "#" are comments; "# vocab n_tokens=N pre=NAME" names the
vocabulary the ids belong to (the test skips on another one).
"""
import argparse
import ctypes
import os
import sys

TEXTS = [
    # English prose
    "Hello world",
    " Hello world",
    "Hello, World!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness.",
    "Retrieval-augmented generation (RAG) prepends retrieved passages to the prompt; "
    "CacheBlend reuses their KV caches and recomputes a few selected tokens.",
    "I'm sure you're right, they've said we'll go, he'd know, it's done, don't.",
    "I'M SURE YOU'RE RIGHT, THEY'VE SAID WE'LL GO, HE'D KNOW, IT'S DONE.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
    "Mr. Smith (aged 42) said: \"Yes\" -- and then 'no'...",
    "e.g. i.e. etc. vs. U.S.A.",
    # code
    "int main(void)\n{\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "def f(x):\n\tif x > 0:\n\t\treturn x * 2\n\treturn -x\n",
    "for (size_t i = 0; i < n; i++) { a[i] += b[i] << 2; }",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><a href=\"https://example.com/a?b=c&d=e\">link</a></div>",
    "SELECT name, COUNT(*) FROM users WHERE id >= 10 GROUP BY name;",
    "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n",
    "x=1;y=2;z=x+y*3/4-5%6^7|8&9~0",
    "C:\\Windows\\System32\\drivers\\etc\\hosts",
    "user@example.org, https://www.example.com:8080/path/to/file.html#frag",
    # numbers
    "3",
    "33",
    "333",
    "3333",
    "1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.14159265358979 2.71828 -0.5 +7 1e-9 0x1F 0b1010 1_000_000",
    "In 2024, 1,000,000 people paid $1,234.56 each (about 1.2%).",
    "Call 555-0123 or +1 (800) 555-0199 before 12:30 on 2024-06-30.",
    "\u00bd \u00bc \u2153 \u2160 \u2161 \u00b2 \u00b3 \u0663\u0664\u0665 \u096a\u096b",
    # whitespace runs
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\t\n",
    "a  b   c    d     e",
    "    Hello\n    Hello",
    "end with spaces   ",
    "   start with spaces",
    "\t\t\tindented with tabs\n\t\t\t\tmore",
    "line one\r\nline two\r\n\r\nline four",
    " \n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "word\u00a0nbsp\u3000ideographic\u2009thin\u2003em\u2028ls\u0085nel",
    "fig\u2007ure nar\u202frow math\u205fspace og\u1680ham \u2000\u200a\u2029end",
    # U+180E is no longer whitespace (Unicode 6.3) but still is to PCRE2's \\s
    "mongolian\u180evowel sep \u180e'rek x\n\n\u180e y  \u180e",
    "ctrl\x01\x02\x1c\x1d\x1e\x1f\x7fend",
    "nul\x00byte",
    # accents and other scripts
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 Z\u00fcrich \u00c5ngstr\u00f6m F\u00fc\u00dfe \u0153uvre",
    "e\u0301 a\u0308 n\u0303 (combining marks)",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
    "C\u1eeda Vi\u1ec7t",
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\u1781\u179b\u1785\u17c1\u1789",
    # CJK
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3068\u30ab\u30bf\u30ab\u30ca\u3001\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    # emoji and symbols
    "\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 (only emoji that has its own token)",
    "\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1eb\U0001f1f7 \U0001f999\U0001f999",
    "\u2211 x\u00b2 \u2264 \u221e, a \u2260 b, \u03b1\u2192\u03b2, \u00a9 \u00ae \u2122 \u20ac 100",
    "\u201csmart quotes\u201d \u2018single\u2019 \u2014 dash \u2013 en \u2026 ellipsis",
    "!!!!!! ?????? ...... ------======= ''''''``````\"\"\"\"",
    "zero\u200bwidth\u200cjoiner\u200dchars\ufeffbom",
    # chat markup (also tokenized with special parsing)
    "<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\nThe answer is 4.<|im_end|>\n<|endoftext|>",
    "text <|im_end|> text<|im_end|><|im_end|> <|im_start|>",
    "<|im_start <|im_end| im_end|> <|endoftext",
    "<repo_name>cacheblend<file_sep>lib/infer/vocab.c\n<filename>x.py<gh_stars>10",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<|endoftext|><|endoftext|>",
]

# Gemma's SentencePiece vocabulary: its control tokens, chat markup, runs of
# spaces and newlines (whole tokens there), byte fallback, digits one by one.
GEMMA_TEXTS = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nYou are a helpful assistant.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n",
    "<bos><eos><pad><unk><mask> <bos>text<eos>",
    "<start_of_turn <end_of_turn start_of_turn> <start_of_image> <end_of_image>",
    "[multimodal] <unused0> <unused99> <image_soft_token>",
    "<b>bold</b> <i>x</i> <table><tr><td>1</td></tr></table>",
    "\u2581leading lower block \u2581\u2581 two",
    "tab\there\t\t\ttabs      six spaces                  eighteen",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "12345678901234567890 3.14 1,000,000",
    "\U00010348 \U0001d11e \U000e0041 rare code points \u0fff\u2fff",
    "Quel est le r\u00f4le de l'\u00e9quipe ? \u00bfQu\u00e9 tal? Wie geht's?",
]

LONG = (
    "Large language models answer questions about documents by reading them in the prompt. "
    "When the same documents come back in many prompts, the work of encoding them is repeated. "
    "Caching the key and value tensors of each document saves that work, but the caches of "
    "separately encoded documents do not see each other, and cross-attention between them is lost. "
) * 8


def escape(b: bytes) -> str:
    out = []
    for c in b.decode("utf-8"):
        o = ord(c)
        if c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif o in (0x85, 0x2028, 0x2029):  # line breaks to some tools: escape their bytes
            out.append("".join("\\x%02x" % x for x in c.encode("utf-8")))
        else:
            out.append(c)
    return "".join(out)


def default_model() -> str:
    if os.environ.get("CB_MODEL"):
        return os.environ["CB_MODEL"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cacheblend", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


class Vocab:
    def __init__(self, path: str):
        import llama_cpp

        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def n_tokens(self) -> int:
        return self.lc.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: bytes, special: bool) -> list:
        return self.llm.tokenize(text, add_bos=False, special=special)

    def detokenize(self, ids: list, unparse_special: bool) -> bytes:
        arr = (self.lc.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lc.llama_detokenize(self.vocab, arr, len(ids), buf, size,
                                         False, unparse_special)
            if n >= 0:
                return buf.raw[:n]
            size = -n + 1


def gguf_string(path: str, key: str) -> str:
    """The string value of a metadata key, read straight from the file."""
    import struct

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("Q"))

        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                et, n = rd("I"), rd("Q")
                if et == 8:
                    for _ in range(n):
                        rstr()
                else:
                    f.seek(sizes[et] * n, 1)
            else:
                f.seek(sizes[t], 1)

        if f.read(4) != b"GGUF":
            return ""
        rd("I")
        rd("Q")
        n_kv = rd("Q")
        for _ in range(n_kv):
            k = rstr().decode()
            t = rd("I")
            if k == key and t == 8:
                return rstr().decode()
            skip(t)
    return ""


def write_golden(model: str, out: str) -> None:
    import llama_cpp

    v = Vocab(model)
    pre = gguf_string(model, "tokenizer.ggml.pre") or "default"
    lines = [
        "# %s - token ids from llama.cpp for the vocabulary of %s."
        % (os.path.basename(out), os.path.basename(model)),
        "# Generated by scripts/gen-golden-tokens.py with llama-cpp-python %s; do not edit."
        % llama_cpp.__version__,
        "# Fields (tab-separated): mode, text, ids, llama_detokenize(ids); see the script.",
        "# vocab n_tokens=%d pre=%s" % (v.n_tokens(), pre),
    ]
    texts = TEXTS + [LONG]
    if len(v.tokenize(b"<start_of_turn>", True)) == 1:
        texts += GEMMA_TEXTS
    for t in texts:
        b = t.encode("utf-8")
        modes = ["plain", "special"] if "<" in t else ["plain"]
        for mode in modes:
            special = mode == "special"
            ids = v.tokenize(b, special)
            detok = v.detokenize(ids, special)
            lines.append("\t".join([mode, escape(b), " ".join(map(str, ids)), escape(detok)]))
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %d cases" % (out, len(lines) - 4), file=sys.stderr)


def dump_suite(vocab: str, inp: str) -> None:
    v = Vocab(vocab)
    raw = open(inp, "rb").read()
    sep = b"\n__ggml_vocab_test__\n"
    parts = raw.split(sep)
    if raw.endswith(sep):
        parts = parts[:-1]
    for p in parts:
        print(" " + " ".join(map(str, v.tokenize(p, False))) if p else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF model (default: the SmolLM2 model)")
    ap.add_argument("-o", "--output", default="tests/data/smollm2-golden.txt")
    ap.add_argument("--vocab", help="dump ids for a conformance vocab file instead")
    ap.add_argument("--inp", help="inputs for --vocab (default VOCAB.inp)")
    ap.add_argument("--text", help="print the ids of one text")
    ap.add_argument("--special", action="store_true", help="with --text: parse special tokens")
    a = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("gen-golden-tokens.py: needs llama-cpp-python (pip install llama-cpp-python)",
              file=sys.stderr)
        return 2
    if a.vocab:
        dump_suite(a.vocab, a.inp or a.vocab + ".inp")
        return 0
    model = a.model or default_model()
    if not os.path.exists(model):
        print("gen-golden-tokens.py: %s: no such model (make model)" % model, file=sys.stderr)
        return 2
    if a.text is not None:
        print(" ".join(map(str, Vocab(model).tokenize(a.text.encode("utf-8"), a.special))))
        return 0
    write_golden(model, a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
