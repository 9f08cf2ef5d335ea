#include "engine/grammar_shape.h"

#include "common/errors.h"

#include "pydflash2.h"

#include <llama.h>

#include <algorithm>
#include <exception>
#include <string>

#if !defined(_WIN32)
#include <pthread.h>
#endif

namespace pdf2 {

namespace {

// A run of decimal digits as a count (saturating: a bound past 10^15 is as bad as any).
int64_t read_count(const char *& p) {
    int64_t v = 0;
    while (*p >= '0' && *p <= '9') {
        v = std::min<int64_t>(v * 10 + (*p - '0'), 1000000000000000LL);
        ++p;
    }
    return v;
}

void skip_space(const char *& p) {
    while (*p == ' ' || *p == '\t') {
        ++p;
    }
}

// Past a quoted literal, a [...] class or a <...> token: `close` ends it, a backslash escapes
// the next character, the text's end ends it too (the parser reports that one).
void skip_delimited(const char *& p, char close) {
    ++p;
    while (*p != '\0' && *p != close) {
        if (*p == '\\' && p[1] != '\0') {
            ++p;
        }
        ++p;
    }
    if (*p == close) {
        ++p;
    }
}

}  // namespace

GrammarShape grammar_shape(const char * gbnf) {
    GrammarShape s;
    int64_t depth = 0;
    const char * p = gbnf;
    while (*p != '\0') {
        const char c = *p;
        if (c == '#') {  // a comment, to the end of its line
            while (*p != '\0' && *p != '\n' && *p != '\r') {
                ++p;
            }
        } else if (c == '"') {
            skip_delimited(p, '"');
        } else if (c == '[') {
            skip_delimited(p, ']');
        } else if (c == '<') {
            skip_delimited(p, '>');
        } else if (c == '(') {
            ++depth;
            ++s.rules;
            s.depth = std::max(s.depth, depth);
            ++p;
        } else if (c == ')') {
            depth = std::max<int64_t>(0, depth - 1);
            ++p;
        } else if (c == '*' || c == '+' || c == '?') {
            ++s.rules;
            ++p;
        } else if (c == ':' && p[1] == ':' && p[2] == '=') {
            ++s.rules;
            p += 3;
        } else if (c == '{') {
            ++p;
            skip_space(p);
            const int64_t lo = read_count(p);
            int64_t hi = lo;
            skip_space(p);
            if (*p == ',') {
                ++p;
                skip_space(p);
                hi = (*p >= '0' && *p <= '9') ? read_count(p) : -1;
            }
            if (hi >= 0 && hi < lo) {  // llama.cpp counts n - m unsigned: it would derive rules for ever
                throw Error("grammar: the repetition {" + std::to_string(lo) + "," + std::to_string(hi) +
                            "} has its upper bound below its lower bound");
            }
            s.max_repeat = std::max({s.max_repeat, lo, hi});
            s.rules += hi < 0 ? 1 : std::max<int64_t>(1, hi - lo);
        } else {
            ++p;
        }
    }
    return s;
}

void check_grammar_shape(const char * gbnf) {
    const GrammarShape s = grammar_shape(gbnf);
    if (s.depth > kMaxGrammarDepth) {
        throw Error("grammar: groups nested " + std::to_string(s.depth) + " deep, more than the engine's limit of " +
                    std::to_string(kMaxGrammarDepth) + " (llama.cpp's parser recurses once per level)");
    }
    if (s.rules > kMaxGrammarRules) {
        throw Error("grammar: " + std::to_string(s.rules) + " rules (defined and derived), more than the engine's "
                    "limit of " + std::to_string(kMaxGrammarRules));
    }
}

namespace {

// fn() on a thread with a stack of `bytes` (where threads can be given one), its exception rethrown here.
template <typename Fn>
void run_with_stack(size_t bytes, Fn && fn) {
#if defined(_WIN32)
    (void) bytes;
    fn();
#else
    struct Call {
        Fn * fn;
        std::exception_ptr error;
        static void * run(void * p) {
            auto * c = static_cast<Call *>(p);
            try {
                (*c->fn)();
            } catch (...) {
                c->error = std::current_exception();
            }
            return nullptr;
        }
    } call{&fn, nullptr};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    const int set = pthread_attr_setstacksize(&attr, bytes);
    pthread_t thread;
    const int made = set == 0 ? pthread_create(&thread, &attr, &Call::run, &call) : set;
    pthread_attr_destroy(&attr);
    if (made != 0) {
        throw Error("grammar: could not start a thread to parse it (" + std::to_string(made) + ")");
    }
    pthread_join(thread, nullptr);
    if (call.error) {
        std::rethrow_exception(call.error);
    }
#endif
}

}  // namespace

llama_sampler * init_grammar_sampler(const llama_vocab * vocab, const char * gbnf) {
    check_grammar_shape(gbnf);
    llama_sampler * sampler = nullptr;
    run_with_stack(kGrammarStackBytes, [&] { sampler = llama_sampler_init_grammar(vocab, gbnf, "root"); });
    if (sampler == nullptr) {
        throw Error("grammar: llama.cpp could not parse it as GBNF with a 'root' rule (a syntax error, an "
                    "undefined rule, left recursion, or a repetition of more than 2000 rules)");
    }
    return sampler;
}

}  // namespace pdf2

extern "C" int pdf2_grammar_check(const void * vocab, const char * gbnf) {
    return pdf2::guarded<int>(-1, [&]() -> int {
        if (vocab == nullptr || gbnf == nullptr) {
            throw pdf2::Error("grammar_check: NULL argument");
        }
        llama_sampler_free(pdf2::init_grammar_sampler(static_cast<const llama_vocab *>(vocab), gbnf));
        return 0;
    });
}

extern "C" int pdf2_grammar_shape(const char * gbnf, int64_t * depth, int64_t * rules, int64_t * max_repeat) {
    return pdf2::guarded<int>(-1, [&]() -> int {
        if (gbnf == nullptr || depth == nullptr || rules == nullptr || max_repeat == nullptr) {
            throw pdf2::Error("grammar_shape: NULL argument");
        }
        const pdf2::GrammarShape s = pdf2::grammar_shape(gbnf);
        *depth = s.depth;
        *rules = s.rules;
        *max_repeat = s.max_repeat;
        return 0;
    });
}
