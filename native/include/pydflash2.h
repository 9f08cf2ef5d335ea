/*
 * pydflash2 native core: the C API that Python reaches through cffi.
 *
 * Everything between the cdef markers is plain C that cffi parses as is
 * (no preprocessor lines there). Functions never abort: they return NULL or
 * a non-zero code and leave a message for pdf2_last_error().
 * Strings returned as `char *` are owned by the caller: free them with
 * pdf2_free_string().
 */
#ifndef PYDFLASH2_H
#define PYDFLASH2_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */

/* Message of the last failed call on this thread ("" if none). */
const char * pdf2_last_error(void);

/* Frees a string returned by this library. NULL is allowed. */
void pdf2_free_string(char * s);

/* JSON object: ggml/llama build info and the ggml backend devices present. */
char * pdf2_native_info_json(void);

/* Name of the ggml device a device string selects: NULL, "" or "auto" = the
 * first GPU-type device, else "CPU"; otherwise a device name, matched
 * case-insensitively. NULL (see pdf2_last_error, which lists the devices)
 * for an unknown name. */
char * pdf2_device_resolve(const char * name);

/* Registers ggml RPC servers ("HOST:PORT[,HOST:PORT...]") as ggml devices, as
 * llama-server's --rpc does; a server registered before is not added again.
 * Every endpoint is checked (syntax, TCP reachability) before any is added.
 * JSON array of the names of the servers' devices ("RPC0"...), NULL on
 * failure (no RPC backend in this build, malformed or unreachable endpoint). */
char * pdf2_rpc_add_servers_json(const char * endpoints);

/* JSON object for a target GGUF: its weight tensors' ggml types ("types":
 * {"q4_0": n...}) and how many of each the CPU backend would repack into an
 * interleaved layout on this machine ("repacked"), which changes the kernels
 * between small and larger batches. Reads metadata only; NULL on failure. */
char * pdf2_target_weights_json(const char * path);

/* Checks a drafter GGUF against the dflash contract without loading weights.
 * JSON object of hyperparameters on success, NULL (see pdf2_last_error) when
 * the file is unreadable or violates the contract. */
char * pdf2_inspect_drafter_json(const char * path);

/* ---- Drafter: the DFlash/DFlash2 forward pass as ggml graphs ----
 * Integer return codes: 0 = success, -1 = failure (see pdf2_last_error);
 * a failed call leaves the drafter usable and its cache unchanged. */
typedef struct pdf2_drafter pdf2_drafter;

/* Loads a drafter GGUF (contract-checked first) and wraps the target GGUF's
 * token embedding in place (mmap; the output head too on the CPU, else it
 * is copied to the device). device: NULL, "" or "auto" = the first GPU ggml
 * offers, else the CPU; otherwise a ggml device name ("CPU", "CUDA0",
 * "Metal", "RPC0"...). n_ctx: context rows the drafter cache holds.
 * n_threads <= 0: all cores. cache_f32: 0 = f16 K/V cache (as llama.cpp),
 * 1 = f32. NULL on failure. */
pdf2_drafter * pdf2_drafter_new(const char * drafter_path, const char * target_path, uint32_t n_ctx,
                                int32_t n_threads, const char * device, int32_t cache_f32);
/* A drafter over `other`'s loaded weights (one copy in memory: the model,
 * its device and threads), with its own cache of n_ctx rows and its own
 * graphs. Drive drafters that share weights from one thread at a time. */
pdf2_drafter * pdf2_drafter_new_sharing(const pdf2_drafter * other, uint32_t n_ctx, int32_t cache_f32);
void pdf2_drafter_free(pdf2_drafter * d);

/* JSON: the drafter's hyperparameters / runtime info (device, cache...). */
char * pdf2_drafter_hparams_json(const pdf2_drafter * d);
char * pdf2_drafter_info_json(const pdf2_drafter * d);
/* At most n graph shapes keep their allocation (default 24; about 1 MB of host
 * memory each for SmolLM2's drafter): fewer for many drafters (a server slot
 * each), more rebuilds when a loop's steps alternate more shapes. 0 / -1. */
int pdf2_drafter_set_max_graphs(pdf2_drafter * d, int32_t n);
/* Allocates all of those graph slots now, sized for the largest shapes and
 * with their host pages written once, so that memory stays flat while serving
 * (a server calls it at startup). 0 / -1. */
int pdf2_drafter_reserve_graphs(pdf2_drafter * d);

int32_t pdf2_drafter_n_cached(const pdf2_drafter * d);
/* Position of the last cached row, -1 when empty. */
int32_t pdf2_drafter_last_pos(const pdf2_drafter * d);
/* Floats per feature row: n_target_layers * hidden size. */
int32_t pdf2_drafter_feature_width(const pdf2_drafter * d);

/* Appends n context rows: features [n][width] (target layer inputs,
 * concatenated), positions strictly increasing and after the cache end. */
int pdf2_drafter_inject(pdf2_drafter * d, const float * features, int64_t width, const int32_t * positions,
                        int32_t n);
/* Drops cached rows at positions >= pos. */
int pdf2_drafter_truncate(pdf2_drafter * d, int32_t pos);

/* Runs block [anchor, MASK x (n-1)] at positions pos..pos+n-1 (2 <= n <=
 * block_size, pos after the cache end). The result stays in the drafter
 * until the next propose: read it with get_lattice / get_logits / select_path. */
int pdf2_drafter_propose(pdf2_drafter * d, int32_t anchor, int32_t pos, int32_t n);
/* inject(features, width, positions, m) then propose(anchor, pos, n) in one graph
 * (m <= block_size; more are injected by graphs of their own first): what the
 * engine runs each step, with the rows it committed. The same ops as the two calls
 * (equal but for float rounding: ggml's matmuls round by the shapes they are given). */
int pdf2_drafter_inject_and_propose(pdf2_drafter * d, const float * features, int64_t width,
                                    const int32_t * positions, int32_t m, int32_t anchor, int32_t pos, int32_t n);

/* DFlash2: candidates [n-1][k] and scores [n-1][k(pred)][k(cand)] of the last
 * proposal, k = selector_top_k; row 0 of each position-1 matrix is the
 * anchor's (all rows equal there). */
int pdf2_drafter_get_lattice(const pdf2_drafter * d, int32_t * candidates, float * scores);
/* DFlash1: logits [n-1][n_vocab] of the drafted positions. */
int pdf2_drafter_get_logits(const pdf2_drafter * d, float * logits);

/* The path selector over the last proposal. selector: 0 greedy (reference), 1
 * sample at temperature (seeded), 2 viterbi (best path). Writes tokens [n-1]
 * and, when not NULL, the draft distributions q_ids/q [n-1][k] (k =
 * selector_top_k for DFlash2, top_k for DFlash1; one-hot unless sampling). */
int pdf2_drafter_select_path(const pdf2_drafter * d, int32_t selector, float temperature, uint64_t seed,
                             int32_t top_k, int32_t * tokens, int32_t * q_ids, float * q);

/* ---- Draft tree: the candidate paths a tree verify checks ----
 * The `budget` most probable nodes of a DFlash2 lattice (candidates [n_pos][k], scores
 * [n_pos][k(pred)][k(cand)], as get_lattice writes them), expanded best first: a path's
 * probability is the product of the selector's softmax at pdf2_draft_tree_temperature() over
 * each position's k candidates in the row its predecessor selects; non-finite scores are no
 * candidates. Writes *n_nodes
 * (<= budget) and per node, in expansion order (a parent before its children): parent (-1 =
 * the anchor), depth (1..n_pos), token, cand (index among the k) and logp (the path's log
 * probability); outputs other than n_nodes may be NULL, else hold `budget` entries. */
int pdf2_draft_tree(const int32_t * candidates, const float * scores, int32_t n_pos, int32_t k, int32_t budget,
                    int32_t * n_nodes, int32_t * parent, int32_t * depth, int32_t * token, int32_t * cand,
                    double * logp);
double pdf2_draft_tree_temperature(void);
/* One tree from two draft sources (native/src/engine/merged_draft_tree.h): the
 * lattice's nodes and the context's, each a trie (parent before child, -1 = under
 * the anchor) with calibrated estimates p in [0, 1] and raw log-estimates;
 * shared prefixes merge (the larger p), each p is capped by its parent's, and the
 * best `budget` nodes of the union are taken best first with at most max_leaves
 * leaves. Writes the nodes in that order (capacity: budget): parent, depth,
 * token, origin (bit 1 lattice, bit 2 context) and log of the merged estimate.
 * 0, or -1 (pdf2_last_error). */
int pdf2_merge_draft_trees(const int32_t * lat_parent, const int32_t * lat_token, const double * lat_p,
                           const double * lat_logp, int32_t n_lat, const int32_t * ctx_parent,
                           const int32_t * ctx_token, const double * ctx_p, const double * ctx_logp,
                           int32_t n_ctx, int32_t budget, int32_t max_leaves, int32_t * n_nodes,
                           int32_t * parent, int32_t * depth, int32_t * token, uint8_t * origin,
                           double * logp);
/* Context drafts' limits: the most nodes and leaves of a context or merged tree
 * (the node budget an engine's context_nodes asks for), and its deepest path. */
void pdf2_context_draft_limits(int32_t * max_nodes, int32_t * max_branches, int32_t * max_depth);

/* ---- Context drafts: what followed earlier occurrences of a stream's suffix ----
 * A hashed n-gram index over one stream (prompt lookup): propose merges, into a trie, the
 * continuations (up to max_depth tokens) of the max_occurrences most recent earlier occurrences of
 * the stream's longest suffix (min_ngram..max_ngram tokens) that occurs earlier. Writes *n_nodes and
 * per node, first seen first (a parent before its children, occurrences most recent first): parent
 * (-1 = under the stream's last token), depth (1..max_depth), token and count (the occurrences
 * through it); *match_length (0: no match, no nodes) and *n_occurrences. capacity must be at least
 * max_depth x max_occurrences; outputs other than n_nodes may be NULL, else hold capacity entries.
 * The cache is the same over past outputs (documents), the oldest dropped beyond max_documents or
 * max_tokens (a document longer than max_tokens, or empty, is not kept); it proposes for another
 * stream's suffix (query), a match and its continuation within one document. The per-key caches
 * keep one such cache per key (an API key), the least recently used key dropped beyond max_keys.
 * set_hash_bits (tests, before the first append/add) keeps `bits` bits of each n-gram hash so that
 * collisions are common. 0 / -1, a new handle / NULL, with pdf2_last_error() saying why. */
typedef struct pdf2_context_index pdf2_context_index;
pdf2_context_index * pdf2_context_index_new(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences);
void pdf2_context_index_free(pdf2_context_index * idx);
int pdf2_context_index_set_hash_bits(pdf2_context_index * idx, int32_t bits);
int pdf2_context_index_append(pdf2_context_index * idx, const int32_t * tokens, int32_t n);
int64_t pdf2_context_index_size(const pdf2_context_index * idx);
int pdf2_context_index_propose(const pdf2_context_index * idx, int32_t max_depth, int32_t capacity, int32_t * n_nodes,
                               int32_t * parent, int32_t * depth, int32_t * token, int32_t * count,
                               int32_t * match_length, int32_t * n_occurrences);

typedef struct pdf2_context_cache pdf2_context_cache;
pdf2_context_cache * pdf2_context_cache_new(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences,
                                            int32_t max_documents, int64_t max_tokens);
void pdf2_context_cache_free(pdf2_context_cache * cache);
int pdf2_context_cache_set_hash_bits(pdf2_context_cache * cache, int32_t bits);
int pdf2_context_cache_add(pdf2_context_cache * cache, const int32_t * tokens, int32_t n);
int pdf2_context_cache_propose(const pdf2_context_cache * cache, const int32_t * query, int32_t n_query,
                               int32_t max_depth, int32_t capacity, int32_t * n_nodes, int32_t * parent,
                               int32_t * depth, int32_t * token, int32_t * count, int32_t * match_length,
                               int32_t * n_occurrences);
int64_t pdf2_context_cache_n_documents(const pdf2_context_cache * cache);
int64_t pdf2_context_cache_n_tokens(const pdf2_context_cache * cache);

typedef struct pdf2_context_caches pdf2_context_caches;
pdf2_context_caches * pdf2_context_caches_new(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences,
                                              int32_t max_documents, int64_t max_tokens, int32_t max_keys);
void pdf2_context_caches_free(pdf2_context_caches * caches);
/* add and propose make the key's cache if it has none, and make the key the most recently used. */
int pdf2_context_caches_add(pdf2_context_caches * caches, const char * key, const int32_t * tokens, int32_t n);
int pdf2_context_caches_propose(pdf2_context_caches * caches, const char * key, const int32_t * query,
                                int32_t n_query, int32_t max_depth, int32_t capacity, int32_t * n_nodes,
                                int32_t * parent, int32_t * depth, int32_t * token, int32_t * count,
                                int32_t * match_length, int32_t * n_occurrences);
int64_t pdf2_context_caches_n_keys(const pdf2_context_caches * caches);
/* 1 if the key has a cache, 0 if not (not a use); n_documents: its documents (0 without a cache). */
int pdf2_context_caches_contains(const pdf2_context_caches * caches, const char * key);
int64_t pdf2_context_caches_n_documents(const pdf2_context_caches * caches, const char * key);

/* ---- Draft length: the chain's formula ----
 * (What the engine chose and measured comes with its stats: pdf2_batch_engine_slot_stats_json's
 * "plans"; no second decision is made outside it.)
 * The engines' acceptance prior: a block position never drafted counts as prior_accepted accepted
 * drafts in prior_reached blocks that reached it (1 in 2). */
double pdf2_draft_prior_reached(void);
double pdf2_draft_prior_accepted(void);
/* Committed tokens per step (1 + expected accepted drafts) of a chain of n drafts whose block
 * positions are accepted with the conditional rates acceptance[0..n) (all in [0, 1]); -1 on bad input. */
double pdf2_expected_tokens(const double * acceptance, int32_t n);

/* ---- Grammars: the shape of a GBNF text, measured without recursion ----
 * depth: the deepest nesting of ( ) groups (llama.cpp's parser recurses once per level, so
 * a deep enough text overflows the stack); rules: the rules defined plus those the parser
 * derives (one per group and per * + ?, n - m per {m,n}); max_repeat: the largest bound of a
 * {m,n}. The engine refuses a grammar past its hard caps before llama.cpp parses it.
 * 0 / -1 (a NULL argument, or a {m,n} with n < m, on which llama.cpp loops for ever). */
int pdf2_grammar_shape(const char * gbnf, int64_t * depth, int64_t * rules, int64_t * max_repeat);
/* Whether llama.cpp parses gbnf (root rule "root") against vocab (a llama_vocab *), as the
 * engine parses a request's grammar: within the hard caps, on a thread with a 64 MiB stack.
 * 0, or -1 with pdf2_last_error() saying why. */
int pdf2_grammar_check(const void * vocab, const char * gbnf);

/* ---- Engine: the draft-verify loop (Python API, CLI and server) ----
 * Continuous batching: n_slots requests at once, each slot a sequence of ONE
 * target context, all verify rows of a step in one llama_decode.
 * pdf2_batch_engine_new owns that context, made from target_model (a
 * llama_model *, e.g. llama_cpp.Llama._model.model, which must outlive the
 * engine) with n_slots sequences of n_ctx_slot tokens each. drafters: n_slots
 * distinct drafters (each slot keeps its context in its drafter's cache), or
 * NULL/0 with n_max = 0. n_threads (one-row decodes and verify rows) /
 * n_threads_batch (prompt chunks) <= 0: llama.cpp's default. flash_attn: -1
 * auto, 0 off, 1 on. n_max: drafts per block, -1 = adaptive, 0 = plain
 * decoding. max_draft >= 0 caps the drafts per step (as in
 * pdf2_batch_engine_new_borrowed; < 0: no cap). selector (the path selector):
 * -1 auto (sample when the target samples, else greedy), 0 greedy, 1 sample, 2
 * viterbi. q_top_k: support of a DFlash1 draft
 * distribution. The drafters' features come through llama.cpp's layer-input
 * taps, or, for an architecture without them (capture rule), through the
 * capture callback the engine installs in its own context. tree_budget > 0:
 * each step verifies the best-first tree of that many drafted nodes over the
 * DFlash2 lattice (pdf2_draft_tree) in the same one decode, instead of the
 * greedy selector's chain; the context is then made with a unified KV cache and
 * n_slots x (1 + tree_budget) sequences (0..255; 0 = the chain). tree_budget
 * < 0: automatic, at most -tree_budget nodes: each step's budget (0 = the
 * chain) from the cost model, whose costs then include verifies of up to
 * -tree_budget + 1 rows (pdf2_batch_engine_max_verify_rows). context_nodes > 0
 * (0..255): drafts from the context may run (pdf2_batch_engine_set_context_drafts):
 * what followed earlier occurrences of the sequence's suffix in its prompt and output
 * (and past outputs), verified as a tree of at most context_nodes nodes and 8 leaves,
 * alone or merged with the lattice's; the context then has n_slots x (1 + max(8,
 * tree_budget)) sequences, and a step may commit up to 33 tokens per slot
 * (pdf2_batch_engine_step_width). */
typedef struct pdf2_batch_engine pdf2_batch_engine;

pdf2_batch_engine * pdf2_batch_engine_new(void * target_model, int32_t n_slots, int32_t n_ctx_slot, int32_t n_threads,
                                          int32_t n_threads_batch, int32_t flash_attn, pdf2_drafter ** drafters, int32_t n_drafters,
                                          int32_t n_max, int32_t max_draft, int32_t selector, int32_t q_top_k,
                                          int32_t tree_budget, int32_t context_nodes);
/* One slot in a context the caller owns (target_ctx: a llama_context *, e.g.
 * llama_cpp.Llama._ctx.ctx; its size and threads are the slot's). The owner may
 * decode there between requests: each start() claims the context again and
 * prefills the whole prompt. feature_capture: the context's eval-callback
 * capture when the drafter's features come that way (NULL: llama.cpp's taps).
 * head_capture: the context's eval-callback capture for the lazy LM head
 * (verify decodes stop before the head, which then runs one row at a time for
 * the rows the verify reaches; only where the graph's head is a plain mul_mat,
 * learned from the first full decode), NULL: every verify row's logits.
 * drafter: NULL with n_max = 0. max_draft >= 0 caps the drafts per step (exact
 * mode keeps verify batches below the sizes where ggml switches kernels).
 * tree_budget > 0: tree verification (as above); the context must have a
 * unified KV cache and at least 1 + |tree_budget| sequences (< 0: automatic). */
pdf2_batch_engine * pdf2_batch_engine_new_borrowed(void * target_ctx, struct pdf2_capture * feature_capture,
                                                   struct pdf2_capture * head_capture, pdf2_drafter * drafter,
                                                   int32_t n_max, int32_t max_draft, int32_t selector, int32_t q_top_k,
                                                   int32_t tree_budget, int32_t context_nodes);
/* Turns a borrowed context's layer-input taps off again; call while it lives. 0 / -1. */
int pdf2_batch_engine_release_target(pdf2_batch_engine * e);
/* Frees the engine (a borrowed context is not touched: it may be gone). */
void pdf2_batch_engine_free(pdf2_batch_engine * e);
/* The drafter's block: the most drafts of a chain. */
int32_t pdf2_batch_engine_max_draft(pdf2_batch_engine * e);
/* A step commits at most this + 1 tokens per slot (max_draft, or a context path's depth). */
int32_t pdf2_batch_engine_step_width(pdf2_batch_engine * e);
/* Context drafts for the slot's next requests (engine made with context_nodes > 0):
 * mode 0 off, 1 the request's own prompt and output, 2 also the past outputs of
 * `key` (one cache per key, e.g. an API key, so that no key's outputs draft for
 * another; NULL = ""). 0 / -1. */
int pdf2_batch_engine_set_context_drafts(pdf2_batch_engine * e, int32_t slot, int32_t mode, const char * key);
/* Adds a registered draft source by name to every slot (native draft_sources.cpp: "repeat", the
 * last tokens' repeated run); its candidates join the merged trees beside the context's. Needs an
 * engine made with context_nodes > 0 and every slot idle. 0 / -1 (unknown name, added twice...). */
int pdf2_batch_engine_add_draft_source(pdf2_batch_engine * e, const char * name);
/* One registered draft source alone, as a function of its context (tests and examples): made by
 * name, begun on prompt[0..n_prompt), told one verified step's committed[0..n_committed) (none:
 * n_committed 0), then asked for a block of at most n drafts, a chain, or a tree of at most
 * tree_budget nodes when > 0. Writes *n_nodes, *is_tree and up to cap nodes: token[i], parent[i]
 * (-1: under the anchor; a chain's i - 1). 0 / -1 (an unknown name: the registered ones in the error). */
int pdf2_draft_source_block(const char * name, const int32_t * prompt, int32_t n_prompt, const int32_t * committed,
                            int32_t n_committed, int32_t n, int32_t tree_budget, int32_t cap, int32_t * token,
                            int32_t * parent, int32_t * n_nodes, int32_t * is_tree);
/* Bounds of the global context cache (defaults: 16 keys, per key 256 past outputs and 128K
 * tokens): the least recently used key, and a key's oldest outputs, go first. Empties it. 0 / -1. */
int pdf2_batch_engine_set_context_cache_limits(pdf2_batch_engine * e, int32_t max_keys, int32_t max_documents,
                                               int64_t max_tokens);
/* Rows per product of the lazy LM head: 1 (one row at a time) or 8 (a group, where reading the head's
 * weight bounds its product); 0 (the default) lets the engine time both at its first verify of enough
 * rows and choose. engine_stats' "lazy_head_group" says which it uses. 0 / -1 (out of range). */
int pdf2_batch_engine_set_lazy_head_group(pdf2_batch_engine * e, int32_t rows);
/* Which LM head the verifies run: 0 (the default) chooses from the measured costs (set_costs'
 * verify_full_s against verify_s and head_s: the full head where its decodes cost no more than the
 * lazy head's with a second row read), 1 the lazy head, 2 the full head (every verify row's head in
 * the decode's graph). A lazy head group set (> 0) and exact batches keep the lazy head.
 * engine_stats' "head" says which runs, "head_chosen_by" how. 0 / -1. */
int pdf2_batch_engine_set_head_mode(pdf2_batch_engine * e, int32_t mode);
/* Rows of the largest verify the cost model prices: max_draft + 1, or an automatic tree's budget + 1. */
int32_t pdf2_batch_engine_max_verify_rows(pdf2_batch_engine * e);
/* Exact mode over a target whose matmul kernels switch with the batch size: every target decode
 * in plain decoding's shapes. No decode of verify rows holds more than max_rows rows (the largest
 * batch whose rows equal batch-1 rows; slots verifying together are split into several decodes),
 * prompts are prefilled in plain decoding's chunks (n_batch rows from position 0), and a slot
 * reuses only whole chunks of its last prompt. max_rows 0: off; 1..n_batch, at least
 * max_verify_rows. 0 / -1. */
int pdf2_batch_engine_set_exact_batches(pdf2_batch_engine * e, int32_t max_rows);
/* Cost model for the adaptive draft length (and automatic tree budget): verify_s[B-1] = target
 * decode of B tokens (B = 1..max_verify_rows), draft_s[n-1] = drafting n tokens, plain_s = a
 * one-row decode that skips the drafter's features (0: not measured): the plain step the user
 * would otherwise get, at which the cost model prices plain decoding where it is measurably cheaper
 * than verify_s[0] (plain steps then skip the features); head_s = the lazy LM head's product for
 * one more row a verify reads (0: none; a verify committing k tokens reads k). learn != 0: the costs were measured on
 * this machine and the steps as they run correct them (a plain step's price becomes what plain
 * steps take, other decodes' the table scaled by what verify steps take); 0: they stay as given.
 * verify_full_s[B-1] (n_full = n_verify, or 0: none): the same decodes with every row's LM head in
 * the decode's graph (the full head), where verify_s holds the lazy head's; zeros: not measured.
 * With both, the engine chooses the head (set_head_mode) and prices with its table. */
int pdf2_batch_engine_set_costs(pdf2_batch_engine * e, const double * verify_s, int32_t n_verify,
                                const double * draft_s, int32_t n_draft, double plain_s, double head_s,
                                int32_t learn, const double * verify_full_s, int32_t n_full);
/* Measures those costs on a slot whose prefill is done (its state is restored); verify_full_s
 * (n_verify entries) gets the full head's decodes where the lazy head can run, else zeros. */
int pdf2_batch_engine_measure_costs(pdf2_batch_engine * e, int32_t slot, int32_t reps, double * verify_s,
                                    int32_t n_verify, double * draft_s, int32_t n_draft, double * plain_s,
                                    double * head_s, double * verify_full_s);
/* A request's sampler chain, applied as llama-cpp-python applies it, with
 * llama.cpp's own samplers: logit bias, penalties, grammar, then (temperature
 * > 0) top-k, top-p, min-p, temperature; greedy (temperature 0) takes the
 * argmax after bias, penalties and grammar. top_k <= 0, top_p 1, min_p 0 are
 * off. logit_bias: n_logit_bias (token id, bias) pairs added to the logits (-inf:
 * never). repeat_penalty (1 off), frequency_penalty and presence_penalty (0
 * off) over the last repeat_last_n committed tokens (-1: the whole context).
 * grammar: GBNF text with a `root` rule, NULL or "" for none (a text llama.cpp
 * cannot parse fails start()). n_logprobs: -1 none, else each committed
 * token's log-probability and its top n_logprobs (<= 20) alternatives.
 * max_tokens > 0: the request wants at most that many tokens, so no step
 * drafts past them (<= 0: no limit; the caller stops the slot). Every value is
 * checked before llama.cpp sees it. */
typedef struct pdf2_sampling {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
    int32_t max_tokens;
    float repeat_penalty;
    float frequency_penalty;
    float presence_penalty;
    int32_t repeat_last_n;
    const char * grammar;
    const int32_t * logit_bias_tokens;
    const float * logit_bias_values;
    int32_t n_logit_bias;
    int32_t n_logprobs;
} pdf2_sampling;
/* Queues a prompt on an idle slot (prefilled by the next steps; its first
 * token comes with the step that finishes the prefill). 0 / -1. */
int pdf2_batch_engine_start(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt, int32_t n_prompt,
                            const pdf2_sampling * sampling);
/* A request's sampler chain made ahead of start (its grammar parsed, every value
 * checked), on any thread: it reads only the target model's vocabulary, so a long
 * grammar parse never holds up the thread that steps the engine. n_ctx_slot: the
 * engine's context per slot (start refuses a chain made for another). NULL on
 * failure (pdf2_last_error). */
typedef struct pdf2_prepared_sampling pdf2_prepared_sampling;
pdf2_prepared_sampling * pdf2_prepare_sampling(void * target_model, int32_t n_ctx_slot, const pdf2_sampling * sampling);
void pdf2_prepared_sampling_free(pdf2_prepared_sampling * p);
/* start() with a prepared chain, which it takes (frees) whether it succeeds or not. 0 / -1. */
int pdf2_batch_engine_start_prepared(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt, int32_t n_prompt,
                                     pdf2_prepared_sampling * prepared);
/* Prompt rows an idle slot already holds from its last request (what start()
 * there would not prefill), -1 on failure (a busy slot, a bad index). */
int32_t pdf2_batch_engine_cached_prefix(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt, int32_t n_prompt);
/* Frees a slot; a no-op on an idle one. 0 / -1. */
int pdf2_batch_engine_stop(pdf2_batch_engine * e, int32_t slot);
/* One target decode for all busy slots. counts[n_slots]: tokens committed per
 * slot (0 none, -1 context full), tokens[n_slots][step_width+1]. Returns the
 * rows decoded (0 = every slot idle), -1 on failure. */
int32_t pdf2_batch_engine_step(pdf2_batch_engine * e, int32_t * counts, int32_t n_counts, int32_t * tokens,
                               int32_t n_tokens);
/* Log-probabilities of the tokens the slot's last step committed (its request
 * asked for n_logprobs >= 0): logprob[i] of committed token i, top_ids /
 * top_logprobs [i][n_top] its n_top most likely alternatives (n_top = the
 * request's n_logprobs; most likely first). Each is the log-softmax of the
 * target's raw logits, as llama-server's n_probs and llama-cpp-python's
 * logprobs report them. Returns the count (<= capacity), -1 on failure. */
int32_t pdf2_batch_engine_logprobs(pdf2_batch_engine * e, int32_t slot, float * logprob, int32_t * top_ids,
                                   float * top_logprobs, int32_t n_top, int32_t capacity);
/* JSON: engine-wide counters since creation (drafts, accepted per position, seconds...). */
char * pdf2_batch_engine_stats_json(pdf2_batch_engine * e);
/* JSON: the slot's current or last request (prompt rows, tokens, steps, tau,
 * drafted/accepted per position, histogram of drafts per step, acceptance estimate). */
char * pdf2_batch_engine_slot_stats_json(pdf2_batch_engine * e, int32_t slot);

/* ---- Feature capture on any architecture ----
 * llama.cpp taps layer inputs only on some architectures. Elsewhere the
 * features come from the graph evaluation callback: create the target context
 * with cb_eval = pdf2_capture_eval_callback() and cb_eval_user_data = a
 * pdf2_capture, then pass that capture to pdf2_batch_engine_new_borrowed. The capture
 * observes nothing until armed and must outlive the context's last decode. */
typedef struct pdf2_capture pdf2_capture;

/* JSON: the capture rule for a target architecture with n_layer layers:
 * {"arch", "path": "tap"|"callback" (the path pydflash2 uses), "n_layer",
 * "min_layer", "max_layer" (for that path), "max_layer_by_path": {"tap" (only
 * where taps exist), "callback"}, "tap_archs": [...]}; layers are
 * dflash.target_layers values (layer inputs). */
char * pdf2_capture_rule_json(const char * arch, int32_t n_layer);

pdf2_capture * pdf2_capture_new(void);
void pdf2_capture_free(pdf2_capture * c);
/* Address of the ggml_backend_sched_eval_callback for llama_context_params.cb_eval. */
void * pdf2_capture_eval_callback(void);
/* Low-level use (tests, benchmarks): capture the inputs of layers[0..n_layers)
 * (each >= 1: the output of layer L-1, tensor `l_out-<L-1>`) for the next
 * decode of n_rows tokens; then check, read rows [n_rows][n_embd] per layer. */
int pdf2_capture_arm(pdf2_capture * c, const int32_t * layers, int32_t n_layers, int32_t n_embd, int32_t n_rows);
int pdf2_capture_disarm(pdf2_capture * c);
/* 0 when every armed layer was observed with the expected shape, else -1 and
 * pdf2_last_error() names the missing layer. arch only words the message. */
int pdf2_capture_check(const pdf2_capture * c, const char * arch);
int pdf2_capture_rows(const pdf2_capture * c, int32_t layer, float * out, int64_t n_floats);

/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* PYDFLASH2_H */
