// The shape of a GBNF text as llama.cpp's grammar parser will see it, measured
// without recursion: llama.cpp's recursive-descent parser (and its left-recursion
// check over the rules it derives) recurses once per nested group, so a text
// nested deeply enough overflows the thread's stack and kills the process.
#pragma once

#include <cstddef>
#include <cstdint>

struct llama_sampler;
struct llama_vocab;

namespace pdf2 {

struct GrammarShape {
    int64_t depth = 0;       // deepest nesting of ( ) groups
    int64_t rules = 0;       // rules defined plus those the parser derives (groups, repetitions)
    int64_t max_repeat = 0;  // the largest bound of a {m} / {m,n} repetition
};

// Throws pdf2::Error for a {m,n} with n < m: llama.cpp derives n - m rules, unsigned, so it
// would loop for ever (and a thread that never returns holds its request's worker).
GrammarShape grammar_shape(const char * gbnf);

// Hard caps the engine applies before llama.cpp parses a grammar, whatever the caller checked.
// llama.cpp parsed ( ) groups nested 18,600 deep and a chain of 65,400 rules on an 8 MiB stack
// (docs/server.md, "Grammar and schema limits"); it parses here on a thread of kGrammarStackBytes,
// eight times that, so the caps keep a factor of 70 and 5.
constexpr int64_t kMaxGrammarDepth = 2000;
constexpr int64_t kMaxGrammarRules = 100000;
constexpr size_t kGrammarStackBytes = size_t{64} << 20;

// Throws pdf2::Error when the shape passes those caps.
void check_grammar_shape(const char * gbnf);

// llama_sampler_init_grammar(vocab, gbnf, "root") after check_grammar_shape, run on a thread
// with a kGrammarStackBytes stack; throws pdf2::Error when llama.cpp cannot parse it.
llama_sampler * init_grammar_sampler(const llama_vocab * vocab, const char * gbnf);

}  // namespace pdf2
