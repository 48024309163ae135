#include "fuzz_tok.h"
