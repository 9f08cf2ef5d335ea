// Loading: drafter weights into the chosen device's buffers (after the
// contract check), the target's embedding/head wrapped over an mmap.
#include "drafter/drafter_model.h"

#include "common/devices.h"
#include "common/errors.h"

#include <ggml-alloc.h>
#include <gguf.h>
#include <llama.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <thread>

namespace pdf2 {

namespace {

using gguf_ptr = std::unique_ptr<gguf_context, decltype(&gguf_free)>;

std::string shape_of(const int64_t * ne) {
    return "{" + std::to_string(ne[0]) + ", " + std::to_string(ne[1]) + ", " + std::to_string(ne[2]) + ", " +
           std::to_string(ne[3]) + "}";
}

}  // namespace

DrafterModel::DrafterModel(const std::string & drafter_path, const std::string & target_path,
                           const ModelOptions & opts) {
    try {
        // validates every key/tensor/shape/type before any ggml op sees the file
        hp_ = inspect_drafter_file(drafter_path);
        init_backends(opts);
        load_drafter(drafter_path);
        if (!hp_.has_token_embd || !hp_.has_output || !target_path.empty()) {
            if (target_path.empty()) {
                throw Error("the drafter ships no token_embd/output head: a target GGUF path is required");
            }
            load_target(target_path);
        }
    } catch (...) {
        release();
        throw;
    }
}

DrafterModel::~DrafterModel() { release(); }

void DrafterModel::release() {
    if (buf_drafter_) ggml_backend_buffer_free(buf_drafter_);
    if (buf_target_) ggml_backend_buffer_free(buf_target_);
    if (buf_target_dev_) ggml_backend_buffer_free(buf_target_dev_);
    if (buf_d2t_ids_) ggml_backend_buffer_free(buf_d2t_ids_);
    if (ctx_d2t_ids_) ggml_free(ctx_d2t_ids_);
    buf_d2t_ids_ = nullptr;
    ctx_d2t_ids_ = nullptr;
    if (ctx_drafter_) ggml_free(ctx_drafter_);
    if (ctx_target_) ggml_free(ctx_target_);
    if (ctx_target_dev_) ggml_free(ctx_target_dev_);
    if (map_addr_) munmap(map_addr_, map_size_);
    if (backend_ && backend_ != backend_cpu_) ggml_backend_free(backend_);
    if (backend_cpu_) ggml_backend_free(backend_cpu_);
    buf_drafter_ = buf_target_ = buf_target_dev_ = nullptr;
    ctx_drafter_ = ctx_target_ = ctx_target_dev_ = nullptr;
    map_addr_ = nullptr;
    backend_ = backend_cpu_ = nullptr;
}

void DrafterModel::init_backends(const ModelOptions & opts) {
    ggml_backend_dev_t chosen = find_device(opts.device);
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    dev_ = chosen;
    device_name_ = ggml_backend_dev_name(chosen);
    backend_cpu_ = ggml_backend_dev_init(cpu, nullptr);
    if (backend_cpu_ == nullptr) {
        throw Error("failed to initialise the CPU backend");
    }
    backend_ = chosen == cpu ? backend_cpu_ : ggml_backend_dev_init(chosen, nullptr);
    if (backend_ == nullptr) {
        throw Error("failed to initialise device '" + device_name_ + "'");
    }
    n_threads_ = opts.n_threads > 0 ? opts.n_threads : std::max(1u, std::thread::hardware_concurrency());
    set_cpu_threads(backend_cpu_, n_threads_);
}

void DrafterModel::load_drafter(const std::string & path) {
    ggml_context * meta = nullptr;
    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/&meta};
    gguf_ptr g(gguf_init_from_file(path.c_str(), params), gguf_free);
    if (!g || meta == nullptr) {
        throw Error("'" + path + "' is not a readable GGUF file");
    }
    ctx_drafter_ = meta;
    buf_drafter_ = ggml_backend_alloc_ctx_tensors_from_buft(meta, ggml_backend_dev_buffer_type(dev_));
    if (buf_drafter_ == nullptr) {
        throw Error("failed to allocate the drafter weights on " + device_name_);
    }
    ggml_backend_buffer_set_usage(buf_drafter_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    std::unique_ptr<FILE, decltype(&fclose)> f(std::fopen(path.c_str(), "rb"), fclose);
    if (!f) {
        throw Error("cannot open '" + path + "'");
    }
    const size_t data_off = gguf_get_data_offset(g.get());
    std::vector<char> staging;
    for (int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
        const char * name = gguf_get_tensor_name(g.get(), i);
        ggml_tensor * t = ggml_get_tensor(meta, name);
        const size_t n_bytes = ggml_nbytes(t);
        staging.resize(n_bytes);
        if (fseeko(f.get(), static_cast<off_t>(data_off + gguf_get_tensor_offset(g.get(), i)), SEEK_SET) != 0 ||
            std::fread(staging.data(), 1, n_bytes, f.get()) != n_bytes) {
            throw Error("failed to read tensor '" + std::string(name) + "' from '" + path + "'");
        }
        ggml_backend_tensor_set(t, staging.data(), 0, n_bytes);
    }

    auto get = [&](const std::string & name) -> ggml_tensor * { return ggml_get_tensor(meta, name.c_str()); };
    fc = get("fc.weight");
    enc_norm = get("enc.output_norm.weight");
    out_norm = get("output_norm.weight");
    tok_embd = get("token_embd.weight");
    output = get("output.weight");
    d2t = get("d2t");
    sel_hidden = get("selector_hidden.weight");
    sel_pred = get("selector_predecessor.weight");
    sel_succ = get("selector_successor.weight");
    layers.resize(hp_.n_layer);
    for (uint32_t il = 0; il < hp_.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        DrafterLayer & L = layers[il];
        L.attn_norm = get(p + "attn_norm.weight");
        L.wq = get(p + "attn_q.weight");
        L.wk = get(p + "attn_k.weight");
        L.wv = get(p + "attn_v.weight");
        L.wo = get(p + "attn_output.weight");
        L.q_norm = get(p + "attn_q_norm.weight");
        L.k_norm = get(p + "attn_k_norm.weight");
        L.ffn_norm = get(p + "ffn_norm.weight");
        L.ffn_gate = get(p + "ffn_gate.weight");
        L.ffn_up = get(p + "ffn_up.weight");
        L.ffn_down = get(p + "ffn_down.weight");
        L.attn_conv_base = get(p + "attn_conv_base");
        L.attn_conv_proj = get(p + "attn_conv_proj.weight");
        L.ffn_conv_base = get(p + "ffn_conv_base");
        L.ffn_conv_proj = get(p + "ffn_conv_proj.weight");
    }
    if (d2t != nullptr) {
        make_d2t_ids();
    }
}

// The selector ranks candidates among the draft rows and reads its tables by
// target id: d2t maps one to the other in the graph (get_rows, which reads
// I32). Its values are checked here: an id outside the vocabulary would make
// ggml read out of bounds.
void DrafterModel::make_d2t_ids() {
    const int64_t n = d2t->ne[0];
    std::vector<int64_t> ids64(static_cast<size_t>(n));
    ggml_backend_tensor_get(d2t, ids64.data(), 0, ids64.size() * sizeof(int64_t));
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const int64_t id = ids64[static_cast<size_t>(i)];
        if (id < 0 || id >= static_cast<int64_t>(hp_.n_vocab)) {
            throw Error("tensor 'd2t' maps draft row " + std::to_string(i) + " to token " + std::to_string(id) +
                        ", outside the vocabulary of " + std::to_string(hp_.n_vocab));
        }
        ids[static_cast<size_t>(i)] = static_cast<int32_t>(id);
    }
    const ggml_init_params ip = {ggml_tensor_overhead(), nullptr, /*no_alloc =*/true};
    ctx_d2t_ids_ = ggml_init(ip);
    d2t_ids = ggml_new_tensor_2d(ctx_d2t_ids_, GGML_TYPE_I32, 1, n);
    ggml_set_name(d2t_ids, "d2t_ids");
    buf_d2t_ids_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_d2t_ids_, ggml_backend_dev_buffer_type(dev_));
    if (buf_d2t_ids_ == nullptr) {
        throw Error("failed to allocate the draft vocabulary map on " + device_name_);
    }
    ggml_backend_buffer_set_usage(buf_d2t_ids_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(d2t_ids, ids.data(), 0, ids.size() * sizeof(int32_t));
}

void DrafterModel::load_target(const std::string & path) {
    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_ptr g(gguf_init_from_file(path.c_str(), params), gguf_free);
    if (!g) {
        throw Error("target '" + path + "' is not a readable GGUF file");
    }
    const int64_t arch_id = gguf_find_key(g.get(), "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(g.get(), arch_id) != GGUF_TYPE_STRING) {
        throw Error("target '" + path + "' has no general.architecture");
    }
    const std::string arch = gguf_get_val_str(g.get(), arch_id);
    if (arch == "dflash") {
        throw Error("target '" + path + "' is a dflash drafter, not a target model");
    }
    const int64_t H = hp_.n_embd;
    const int64_t V = hp_.n_vocab;
    const int64_t emb_id = gguf_find_tensor(g.get(), "token_embd.weight");
    if (emb_id < 0) {
        throw Error("target '" + path + "' has no token_embd.weight");
    }
    const int64_t out_id_file = gguf_find_tensor(g.get(), "output.weight");

    // size and bounds of the target file
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
        throw Error("cannot stat target '" + path + "'");
    }
    const size_t file_size = static_cast<size_t>(st.st_size);
    const size_t data_off = gguf_get_data_offset(g.get());

    struct Want {
        const char * role;
        int64_t id;
        ggml_tensor ** slot;
    };
    std::vector<Want> wants;
    if (tok_embd == nullptr) wants.push_back({"token_embd.weight", emb_id, &tok_embd});
    if (output == nullptr) wants.push_back({out_id_file >= 0 ? "output.weight" : "token_embd.weight (tied head)",
                                            out_id_file >= 0 ? out_id_file : emb_id, &output});
    for (const Want & w : wants) {
        const int64_t * ne = gguf_get_tensor_ne(g.get(), w.id);
        const ggml_type type = gguf_get_tensor_type(g.get(), w.id);
        if (ne[0] != H) {
            throw Error("target/drafter mismatch: the target's " + std::string(w.role) + " has hidden size " +
                        std::to_string(ne[0]) + " but the drafter's embedding_length is " + std::to_string(H));
        }
        // the head must cover the draft vocabulary rows; embeddings the full one
        const int64_t want_rows = (w.slot == &output) ? hp_.n_vocab_draft : V;
        if (ne[1] != want_rows || ne[2] != 1 || ne[3] != 1) {
            throw Error("target/drafter mismatch: the target's " + std::string(w.role) + " has shape " + shape_of(ne) +
                        ", expected {" + std::to_string(H) + ", " + std::to_string(want_rows) +
                        ", 1, 1} (vocabulary size " + std::to_string(V) + ")");
        }
        if (type >= GGML_TYPE_COUNT || ggml_get_type_traits(type)->blck_size <= 0 ||
            ggml_get_type_traits(type)->type_size == 0 || type == GGML_TYPE_I32 || type == GGML_TYPE_I64 ||
            ne[0] % ggml_blck_size(type) != 0) {
            throw Error("target tensor " + std::string(w.role) + " has unsupported type " + ggml_type_name(type));
        }
        const size_t end = data_off + gguf_get_tensor_offset(g.get(), w.id) + gguf_get_tensor_size(g.get(), w.id);
        if (end > file_size) {
            throw Error("target tensor " + std::string(w.role) + " extends past the end of '" + path +
                        "' (truncated file?)");
        }
    }
    if (wants.empty()) {
        return;
    }

    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) {
        throw Error("cannot open target '" + path + "'");
    }
    map_addr_ = mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map_addr_ == MAP_FAILED) {
        map_addr_ = nullptr;
        throw Error("mmap of target '" + path + "' failed");
    }
    map_size_ = file_size;

    // Placement, as llama.cpp places a model's input and output layers: the
    // token embedding (a get_rows of a few rows) stays in host memory, wrapped
    // over the mapped pages in place; the output head (a large matmul) lives
    // on the drafter's device, copied there unless that device is the CPU.
    // A tied head then has two tensor objects over one file tensor.
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_dev_props props{};
    ggml_backend_dev_get_props(cpu, &props);
    struct Made {
        int64_t id;
        bool host;
        ggml_tensor * t;
    };
    std::vector<Made> made;
    ggml_init_params ip = {ggml_tensor_overhead() * 4, nullptr, /*no_alloc =*/true};
    ctx_target_ = ggml_init(ip);
    ctx_target_dev_ = ggml_init(ip);
    for (const Want & w : wants) {
        const bool host = props.caps.buffer_from_host_ptr && (device_is_cpu() || w.slot == &tok_embd);
        ggml_tensor * t = nullptr;
        for (const Made & m : made) {
            if (m.id == w.id && m.host == host) t = m.t;
        }
        if (t == nullptr) {
            const int64_t * ne = gguf_get_tensor_ne(g.get(), w.id);
            t = ggml_new_tensor_2d(host ? ctx_target_ : ctx_target_dev_, gguf_get_tensor_type(g.get(), w.id), ne[0],
                                   ne[1]);
            ggml_set_name(t, (std::string("target.") + gguf_get_tensor_name(g.get(), w.id)).c_str());
            made.push_back({w.id, host, t});
        }
        *w.slot = t;
    }

    char * base = static_cast<char *>(map_addr_);
    size_t max_host = 0;
    for (const Made & m : made) {
        if (m.host) max_host = std::max(max_host, ggml_nbytes(m.t));
    }
    if (max_host > 0) {
        // no copy: the pages are shared with llama.cpp's own mapping
        buf_target_ = ggml_backend_dev_buffer_from_host_ptr(cpu, base, file_size, max_host);
        if (buf_target_ == nullptr) {
            throw Error("failed to wrap the target mapping in a CPU buffer");
        }
        for (const Made & m : made) {
            if (!m.host) continue;
            void * addr = base + data_off + gguf_get_tensor_offset(g.get(), m.id);
            if (ggml_backend_tensor_alloc(buf_target_, m.t, addr) != GGML_STATUS_SUCCESS) {
                throw Error("failed to place target tensor in the mapped buffer");
            }
        }
        ggml_backend_buffer_set_usage(buf_target_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        target_mapped_ = true;
    }
    bool any_dev = false;
    for (const Made & m : made) any_dev = any_dev || !m.host;
    if (any_dev) {
        buf_target_dev_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_target_dev_, ggml_backend_dev_buffer_type(dev_));
        if (buf_target_dev_ == nullptr) {
            throw Error("failed to allocate the target head on " + device_name_);
        }
        for (const Made & m : made) {
            if (m.host) continue;
            ggml_backend_tensor_set(m.t, base + data_off + gguf_get_tensor_offset(g.get(), m.id), 0, ggml_nbytes(m.t));
        }
        ggml_backend_buffer_set_usage(buf_target_dev_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    if (!target_mapped_) {
        munmap(map_addr_, map_size_);
        map_addr_ = nullptr;
    }
}

}  // namespace pdf2
