#include "gguf/dflash_contract.h"

#include "common/errors.h"
#include "common/json_writer.h"

#include <ggml.h>
#include <gguf.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>

namespace pdf2 {

namespace {

const char * const ARCH = "dflash";

std::string arch_key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

std::string shape_str(const int64_t * ne, int n) {
    std::string s = "{";
    for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::to_string(ne[i]);
    }
    return s + "}";
}

bool is_int_type(gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
            return true;
        default:
            return false;
    }
}

int64_t read_int_at(const void * data, gguf_type t, size_t i) {
    switch (t) {
        case GGUF_TYPE_UINT8: return static_cast<const uint8_t *>(data)[i];
        case GGUF_TYPE_INT8: return static_cast<const int8_t *>(data)[i];
        case GGUF_TYPE_UINT16: return static_cast<const uint16_t *>(data)[i];
        case GGUF_TYPE_INT16: return static_cast<const int16_t *>(data)[i];
        case GGUF_TYPE_UINT32: return static_cast<const uint32_t *>(data)[i];
        case GGUF_TYPE_INT32: return static_cast<const int32_t *>(data)[i];
        case GGUF_TYPE_UINT64: return static_cast<int64_t>(static_cast<const uint64_t *>(data)[i]);
        case GGUF_TYPE_INT64: return static_cast<const int64_t *>(data)[i];
        default: return 0;
    }
}

// Typed, bounds-checked access to the metadata of one file.
class Meta {
  public:
    explicit Meta(const gguf_context * g) : g_(g) {}

    bool has(const std::string & key) const { return gguf_find_key(g_, key.c_str()) >= 0; }

    int64_t id_of(const std::string & key) const {
        const int64_t id = gguf_find_key(g_, key.c_str());
        if (id < 0) {
            throw Error("missing required metadata key '" + key + "'");
        }
        return id;
    }

    std::string str(const std::string & key) const {
        const int64_t id = id_of(key);
        if (gguf_get_kv_type(g_, id) != GGUF_TYPE_STRING) {
            throw Error("metadata key '" + key + "' must be a string, found " +
                        gguf_type_name(gguf_get_kv_type(g_, id)));
        }
        return gguf_get_val_str(g_, id);
    }

    int64_t integer(const std::string & key, int64_t lo, int64_t hi) const {
        const int64_t id = id_of(key);
        const gguf_type t = gguf_get_kv_type(g_, id);
        if (!is_int_type(t)) {
            throw Error("metadata key '" + key + "' must be an integer, found " + gguf_type_name(t));
        }
        const int64_t v = read_int_at(gguf_get_val_data(g_, id), t, 0);
        if (v < lo || v > hi) {
            throw Error("metadata key '" + key + "' = " + std::to_string(v) + " is out of range [" +
                        std::to_string(lo) + ", " + std::to_string(hi) + "]");
        }
        return v;
    }

    int64_t integer_or(const std::string & key, int64_t lo, int64_t hi, int64_t fallback) const {
        return has(key) ? integer(key, lo, hi) : fallback;
    }

    float real(const std::string & key) const {
        const int64_t id = id_of(key);
        const gguf_type t = gguf_get_kv_type(g_, id);
        if (t == GGUF_TYPE_FLOAT32) {
            return gguf_get_val_f32(g_, id);
        }
        if (t == GGUF_TYPE_FLOAT64) {
            return static_cast<float>(gguf_get_val_f64(g_, id));
        }
        throw Error("metadata key '" + key + "' must be a float, found " + gguf_type_name(t));
    }

    float real_or(const std::string & key, float fallback) const { return has(key) ? real(key) : fallback; }

    bool boolean_or(const std::string & key, bool fallback) const {
        if (!has(key)) {
            return fallback;
        }
        const int64_t id = id_of(key);
        if (gguf_get_kv_type(g_, id) != GGUF_TYPE_BOOL) {
            throw Error("metadata key '" + key + "' must be a bool");
        }
        return gguf_get_val_bool(g_, id);
    }

    std::vector<int64_t> int_array(const std::string & key) const {
        const int64_t id = id_of(key);
        if (gguf_get_kv_type(g_, id) != GGUF_TYPE_ARRAY || !is_int_type(gguf_get_arr_type(g_, id))) {
            throw Error("metadata key '" + key + "' must be an array of integers");
        }
        const gguf_type t = gguf_get_arr_type(g_, id);
        const size_t n = gguf_get_arr_n(g_, id);
        const void * data = gguf_get_arr_data(g_, id);
        std::vector<int64_t> out(n);
        for (size_t i = 0; i < n; ++i) {
            out[i] = read_int_at(data, t, i);
        }
        return out;
    }

    std::vector<bool> bool_array(const std::string & key) const {
        const int64_t id = id_of(key);
        if (gguf_get_kv_type(g_, id) != GGUF_TYPE_ARRAY ||
            (gguf_get_arr_type(g_, id) != GGUF_TYPE_BOOL && !is_int_type(gguf_get_arr_type(g_, id)))) {
            throw Error("metadata key '" + key + "' must be an array of bools");
        }
        const gguf_type t = gguf_get_arr_type(g_, id);
        const size_t n = gguf_get_arr_n(g_, id);
        const void * data = gguf_get_arr_data(g_, id);
        std::vector<bool> out(n);
        for (size_t i = 0; i < n; ++i) {
            out[i] = t == GGUF_TYPE_BOOL ? static_cast<const int8_t *>(data)[i] != 0 : read_int_at(data, t, i) != 0;
        }
        return out;
    }

    size_t string_array_len(const std::string & key) const {
        const int64_t id = id_of(key);
        if (gguf_get_kv_type(g_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(g_, id) != GGUF_TYPE_STRING) {
            throw Error("metadata key '" + key + "' must be an array of strings");
        }
        return gguf_get_arr_n(g_, id);
    }

  private:
    const gguf_context * g_;
};

// What a tensor may be stored as.
enum class Storage {
    Float32,  // norms, conv base kernels: used by elementwise ops, must be F32
    Matrix,   // matmul / get_rows weights: any float or block-quantized type
    Int64,    // d2t
};

bool storage_accepts(Storage s, ggml_type t) {
    switch (s) {
        case Storage::Float32: return t == GGML_TYPE_F32;
        case Storage::Int64: return t == GGML_TYPE_I64;
        case Storage::Matrix:
            if (t == GGML_TYPE_I8 || t == GGML_TYPE_I16 || t == GGML_TYPE_I32 || t == GGML_TYPE_I64) {
                return false;
            }
            return t < GGML_TYPE_COUNT && ggml_get_type_traits(t)->blck_size > 0 && ggml_get_type_traits(t)->type_size > 0;
    }
    return false;
}

const char * storage_name(Storage s) {
    switch (s) {
        case Storage::Float32: return "f32";
        case Storage::Int64: return "i64";
        case Storage::Matrix: return "a float or quantized type";
    }
    return "?";
}

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;  // ggml order
    Storage storage;
};

void check_tensor(const gguf_context * g, const TensorSpec & spec, uint64_t data_end_limit, size_t data_offset) {
    const int64_t id = gguf_find_tensor(g, spec.name.c_str());
    if (id < 0) {
        throw Error("missing required tensor '" + spec.name + "'");
    }
    const int64_t * ne = gguf_get_tensor_ne(g, id);
    std::array<int64_t, GGML_MAX_DIMS> want{1, 1, 1, 1};
    for (size_t i = 0; i < spec.ne.size(); ++i) {
        want[i] = spec.ne[i];
    }
    for (int i = 0; i < GGML_MAX_DIMS; ++i) {
        if (ne[i] != want[i]) {
            throw Error("tensor '" + spec.name + "' has shape " + shape_str(ne, GGML_MAX_DIMS) + ", expected " +
                        shape_str(want.data(), GGML_MAX_DIMS));
        }
    }
    const ggml_type t = gguf_get_tensor_type(g, id);
    if (!storage_accepts(spec.storage, t)) {
        throw Error("tensor '" + spec.name + "' has type " + ggml_type_name(t) + ", expected " +
                    storage_name(spec.storage));
    }
    if (ne[0] % ggml_blck_size(t) != 0) {
        throw Error("tensor '" + spec.name + "': row length " + std::to_string(ne[0]) +
                    " is not a multiple of the block size of " + ggml_type_name(t));
    }
    const uint64_t end = data_offset + gguf_get_tensor_offset(g, id) + gguf_get_tensor_size(g, id);
    if (end > data_end_limit) {
        throw Error("tensor '" + spec.name + "' data ends at byte " + std::to_string(end) +
                    " but the file has only " + std::to_string(data_end_limit) + " bytes (truncated file?)");
    }
}

}  // namespace

DrafterHParams check_dflash_contract(const gguf_context * g, uint64_t file_size) {
    Meta m(g);
    DrafterHParams hp;
    hp.file_size = file_size;

    const std::string arch = m.str("general.architecture");
    if (arch != ARCH) {
        throw Error("general.architecture is '" + arch + "', expected 'dflash' (is this a target model "
                    "rather than a DFlash drafter?)");
    }
    if (m.has("general.name")) {
        hp.name = m.str("general.name");
    }

    constexpr int64_t MAXU = 1LL << 31;
    hp.n_layer = static_cast<uint32_t>(m.integer(arch_key("block_count"), 1, 4096));
    hp.n_ctx_train = static_cast<uint32_t>(m.integer(arch_key("context_length"), 1, MAXU));
    hp.n_embd = static_cast<uint32_t>(m.integer(arch_key("embedding_length"), 1, 1 << 20));
    hp.n_ff = static_cast<uint32_t>(m.integer(arch_key("feed_forward_length"), 1, 1 << 22));
    hp.n_head = static_cast<uint32_t>(m.integer(arch_key("attention.head_count"), 1, 4096));
    hp.n_head_kv = static_cast<uint32_t>(m.integer(arch_key("attention.head_count_kv"), 1, 4096));
    if (hp.n_head % hp.n_head_kv != 0) {
        throw Error("attention.head_count (" + std::to_string(hp.n_head) +
                    ") must be a multiple of attention.head_count_kv (" + std::to_string(hp.n_head_kv) + ")");
    }
    const int64_t default_head_dim = hp.n_embd / hp.n_head;
    hp.head_dim = static_cast<uint32_t>(m.integer_or(arch_key("attention.key_length"), 1, 1 << 16, default_head_dim));
    const int64_t value_length = m.integer_or(arch_key("attention.value_length"), 1, 1 << 16, hp.head_dim);
    if (value_length != hp.head_dim) {
        throw Error("attention.value_length (" + std::to_string(value_length) +
                    ") must equal attention.key_length (" + std::to_string(hp.head_dim) + ")");
    }
    if (hp.head_dim % 2 != 0) {
        throw Error("attention.key_length must be even for RoPE, got " + std::to_string(hp.head_dim));
    }
    hp.rms_eps = m.real(arch_key("attention.layer_norm_rms_epsilon"));
    if (!(hp.rms_eps > 0.0f)) {
        throw Error("attention.layer_norm_rms_epsilon must be > 0");
    }
    hp.rope_freq_base = m.real(arch_key("rope.freq_base"));
    if (!(hp.rope_freq_base > 0.0f)) {
        throw Error("rope.freq_base must be > 0");
    }

    // vocabulary: the tokenizer is the target's; vocab_size must agree with it when both are present
    int64_t n_vocab = -1;
    if (m.has("tokenizer.ggml.tokens")) {
        n_vocab = static_cast<int64_t>(m.string_array_len("tokenizer.ggml.tokens"));
    }
    if (m.has(arch_key("vocab_size"))) {
        const int64_t v = m.integer(arch_key("vocab_size"), 1, MAXU);
        if (n_vocab >= 0 && v != n_vocab) {
            throw Error("dflash.vocab_size (" + std::to_string(v) + ") disagrees with tokenizer.ggml.tokens (" +
                        std::to_string(n_vocab) + " entries)");
        }
        n_vocab = v;
    }
    if (n_vocab <= 0) {
        throw Error("missing required metadata key 'dflash.vocab_size' (and no tokenizer.ggml.tokens to infer it)");
    }
    hp.n_vocab = static_cast<uint32_t>(n_vocab);

    hp.block_size = static_cast<uint32_t>(m.integer(arch_key("block_size"), 2, 1024));
    hp.mask_token_id = static_cast<int32_t>(m.integer("tokenizer.ggml.mask_token_id", 0, MAXU));
    if (static_cast<uint32_t>(hp.mask_token_id) >= hp.n_vocab) {
        throw Error("tokenizer.ggml.mask_token_id = " + std::to_string(hp.mask_token_id) +
                    " is outside the vocabulary of " + std::to_string(hp.n_vocab) + " tokens");
    }
    for (const int64_t id : m.int_array(arch_key("target_layers"))) {
        if (id < 1 || id > 4096) {
            throw Error("dflash.target_layers holds " + std::to_string(id) +
                        "; entries are target layer input indices (Hugging Face id + 1) and must be >= 1");
        }
        hp.target_layers.push_back(static_cast<int32_t>(id));
    }
    if (hp.target_layers.empty()) {
        throw Error("dflash.target_layers is empty");
    }

    hp.causal = m.boolean_or(arch_key("attention.causal"), false);
    hp.sliding_window = static_cast<uint32_t>(m.integer_or(arch_key("attention.sliding_window"), 0, MAXU, 0));
    if (hp.sliding_window > 0 && m.has(arch_key("attention.sliding_window_pattern"))) {
        hp.sliding_window_pattern = m.bool_array(arch_key("attention.sliding_window_pattern"));
        if (hp.sliding_window_pattern.size() != hp.n_layer) {
            throw Error("dflash.attention.sliding_window_pattern has " +
                        std::to_string(hp.sliding_window_pattern.size()) + " entries, expected one per layer (" +
                        std::to_string(hp.n_layer) + ")");
        }
    }
    hp.logit_scale = m.real_or(arch_key("logit_scale"), 0.0f);
    hp.logit_softcap = m.real_or(arch_key("final_logit_softcapping"), 0.0f);
    hp.embedding_scale = m.real_or(arch_key("embedding_scale"), 0.0f);

    // upstream keys DFlash2 on selector_hidden.weight; any other DFlash2-only
    // tensor also counts, so a file missing just that tensor is reported as such
    hp.version = 1;
    for (const char * v2_name : {"selector_hidden.weight", "selector_predecessor.weight",
                                 "selector_successor.weight", "blk.0.attn_conv_base"}) {
        if (gguf_find_tensor(g, v2_name) >= 0) {
            hp.version = 2;
        }
    }
    if (hp.version == 2) {
        hp.conv_kernel_size = static_cast<uint32_t>(m.integer(arch_key("conv_kernel_size"), 1, 64));
        hp.conv_group_size = static_cast<uint32_t>(m.integer(arch_key("conv_group_size"), 1, 1 << 20));
        hp.selector_rank = static_cast<uint32_t>(m.integer(arch_key("selector_rank"), 1, 1 << 16));
        hp.selector_top_k = static_cast<uint32_t>(m.integer(arch_key("selector_top_k"), 1, 1024));
        if (hp.n_embd % hp.conv_group_size != 0) {
            throw Error("embedding_length (" + std::to_string(hp.n_embd) + ") is not divisible by conv_group_size (" +
                        std::to_string(hp.conv_group_size) + ")");
        }
        const uint64_t k = hp.selector_top_k;
        if (hp.n_embd < k * (k + 1)) {
            throw Error("DFlash2 lattice does not fit: embedding_length " + std::to_string(hp.n_embd) +
                        " < selector_top_k*(selector_top_k+1) = " + std::to_string(k * (k + 1)) +
                        " (upstream llama.cpp packs the lattice into hidden-size rows)");
        }
        if (hp.selector_top_k > hp.n_vocab) {
            throw Error("selector_top_k exceeds the vocabulary size");
        }
    }

    // ---- tensors ----
    const int64_t H = hp.n_embd;
    const int64_t F = hp.n_ff;
    const int64_t D = hp.head_dim;
    const int64_t V = hp.n_vocab;
    const int64_t n_tl = static_cast<int64_t>(hp.target_layers.size());

    hp.has_d2t = gguf_find_tensor(g, "d2t") >= 0;
    hp.has_token_embd = gguf_find_tensor(g, "token_embd.weight") >= 0;
    hp.has_output = gguf_find_tensor(g, "output.weight") >= 0;
    int64_t V_draft = V;
    if (hp.has_d2t) {
        const int64_t * ne = gguf_get_tensor_ne(g, gguf_find_tensor(g, "d2t"));
        V_draft = ne[0];
        if (V_draft < 1 || V_draft > V) {
            throw Error("tensor 'd2t' has " + std::to_string(V_draft) + " rows; must be in [1, vocab_size]");
        }
    }
    hp.n_vocab_draft = static_cast<uint32_t>(V_draft);

    std::vector<TensorSpec> specs = {
        {"fc.weight", {n_tl * H, H}, Storage::Matrix},
        {"enc.output_norm.weight", {H}, Storage::Float32},
        {"output_norm.weight", {H}, Storage::Float32},
    };
    if (hp.has_token_embd) specs.push_back({"token_embd.weight", {H, V}, Storage::Matrix});
    if (hp.has_output) specs.push_back({"output.weight", {H, V_draft}, Storage::Matrix});
    if (hp.has_d2t) specs.push_back({"d2t", {V_draft}, Storage::Int64});
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        specs.push_back({p + "attn_norm.weight", {H}, Storage::Float32});
        specs.push_back({p + "attn_q.weight", {H, D * hp.n_head}, Storage::Matrix});
        specs.push_back({p + "attn_k.weight", {H, D * hp.n_head_kv}, Storage::Matrix});
        specs.push_back({p + "attn_v.weight", {H, D * hp.n_head_kv}, Storage::Matrix});
        specs.push_back({p + "attn_output.weight", {D * hp.n_head, H}, Storage::Matrix});
        specs.push_back({p + "attn_q_norm.weight", {D}, Storage::Float32});
        specs.push_back({p + "attn_k_norm.weight", {D}, Storage::Float32});
        specs.push_back({p + "ffn_norm.weight", {H}, Storage::Float32});
        specs.push_back({p + "ffn_gate.weight", {H, F}, Storage::Matrix});
        specs.push_back({p + "ffn_up.weight", {H, F}, Storage::Matrix});
        specs.push_back({p + "ffn_down.weight", {F, H}, Storage::Matrix});
        if (hp.version == 2) {
            const int64_t K = hp.conv_kernel_size;
            const int64_t G = H / hp.conv_group_size;
            specs.push_back({p + "attn_conv_base", {H, K, 2}, Storage::Float32});
            specs.push_back({p + "ffn_conv_base", {H, K, 2}, Storage::Float32});
            specs.push_back({p + "attn_conv_proj.weight", {H, 2 * K * G}, Storage::Matrix});
            specs.push_back({p + "ffn_conv_proj.weight", {H, 2 * K * G}, Storage::Matrix});
        }
    }
    if (hp.version == 2) {
        const int64_t R = hp.selector_rank;
        specs.push_back({"selector_hidden.weight", {H, R}, Storage::Matrix});
        specs.push_back({"selector_predecessor.weight", {R, V}, Storage::Matrix});
        specs.push_back({"selector_successor.weight", {R, V}, Storage::Matrix});
    }

    const size_t data_offset = gguf_get_data_offset(g);
    std::set<std::string> known;
    for (const auto & spec : specs) {
        check_tensor(g, spec, file_size, data_offset);
        known.insert(spec.name);
    }
    hp.n_tensors = gguf_get_n_tensors(g);
    for (int64_t i = 0; i < hp.n_tensors; ++i) {
        const std::string name = gguf_get_tensor_name(g, i);
        if (known.count(name) == 0) {
            throw Error("unexpected tensor '" + name + "' (not part of the " +
                        (hp.version == 2 ? std::string("DFlash2") : std::string("DFlash")) + " contract)");
        }
        const int64_t * ne = gguf_get_tensor_ne(g, i);
        hp.n_params += static_cast<uint64_t>(ne[0] * ne[1] * ne[2] * ne[3]);
    }
    return hp;
}

DrafterHParams inspect_drafter_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) {
        throw Error("cannot open '" + path + "'");
    }
    const uint64_t file_size = static_cast<uint64_t>(f.tellg());
    char magic[4] = {0, 0, 0, 0};
    f.seekg(0);
    f.read(magic, 4);
    if (file_size < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw Error("'" + path + "' is not a GGUF file (bad magic)");
    }
    f.close();

    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/nullptr};
    std::unique_ptr<gguf_context, decltype(&gguf_free)> g(gguf_init_from_file(path.c_str(), params), gguf_free);
    if (!g) {
        throw Error("'" + path + "' is not a readable GGUF file (corrupt or truncated header)");
    }
    return check_dflash_contract(g.get(), file_size);
}

std::string hparams_to_json(const DrafterHParams & hp) {
    JsonWriter w;
    w.begin_object();
    w.field("architecture", "dflash");
    w.field("version", hp.version);
    w.field("name", hp.name);
    w.field("n_layer", hp.n_layer);
    w.field("n_embd", hp.n_embd);
    w.field("n_ff", hp.n_ff);
    w.field("n_head", hp.n_head);
    w.field("n_head_kv", hp.n_head_kv);
    w.field("head_dim", hp.head_dim);
    w.field("n_vocab", hp.n_vocab);
    w.field("n_vocab_draft", hp.n_vocab_draft);
    w.field("n_ctx_train", hp.n_ctx_train);
    w.field("rms_eps", static_cast<double>(hp.rms_eps));
    w.field("rope_freq_base", static_cast<double>(hp.rope_freq_base));
    w.field("block_size", hp.block_size);
    w.field("mask_token_id", hp.mask_token_id);
    w.key("target_layers").begin_array();
    for (const int32_t id : hp.target_layers) {
        w.value(id);
    }
    w.end_array();
    w.field("conv_kernel_size", hp.conv_kernel_size);
    w.field("conv_group_size", hp.conv_group_size);
    w.field("selector_rank", hp.selector_rank);
    w.field("selector_top_k", hp.selector_top_k);
    w.field("causal", hp.causal);
    w.field("sliding_window", hp.sliding_window);
    w.field("logit_scale", static_cast<double>(hp.logit_scale));
    w.field("final_logit_softcapping", static_cast<double>(hp.logit_softcap));
    w.field("embedding_scale", static_cast<double>(hp.embedding_scale));
    w.field("has_token_embd", hp.has_token_embd);
    w.field("has_output", hp.has_output);
    w.field("has_d2t", hp.has_d2t);
    w.field("n_tensors", hp.n_tensors);
    w.field("n_params", hp.n_params);
    w.field("file_size", hp.file_size);
    w.end_object();
    return w.str();
}

}  // namespace pdf2
