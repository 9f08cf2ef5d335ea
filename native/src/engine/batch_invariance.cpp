#include "engine/batch_invariance.h"

#include "common/errors.h"
#include "common/json_writer.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <gguf.h>
#include <llama.h>

#include <cstring>
#include <map>
#include <memory>
#include <tuple>

namespace pdf2 {

namespace {

ggml_backend_dev_t cpu_device() {
    llama_backend_init();  // registers the backends the way llama.cpp does
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (dev == nullptr) {
        throw Error("this ggml has no CPU backend");
    }
    return dev;
}

// The CPU backend's extra buffer types (CPU_REPACK, AMX, KLEIDIAI...): where
// llama.cpp puts weights it wants in another layout (use_extra_bufts).
std::vector<ggml_backend_buffer_type_t> extra_bufts(ggml_backend_dev_t cpu) {
    std::vector<ggml_backend_buffer_type_t> out;
    auto fn = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts"));
    if (fn != nullptr) {
        for (ggml_backend_buffer_type_t * b = fn(cpu); b != nullptr && *b != nullptr; ++b) {
            out.push_back(*b);
        }
    }
    return out;
}

struct GgmlCtxFree {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
struct GgufFree {
    void operator()(gguf_context * c) const { gguf_free(c); }
};
struct BufferFree {
    void operator()(ggml_backend_buffer * b) const { ggml_backend_buffer_free(b); }
};

// Would `buft` take a weight of this type and shape into its own layout? Asked
// with a small stand-in (same type, row length and row count modulo 16, which
// is what the repack kernels' shape conditions look at): the CPU_REPACK buffer
// sets tensor->extra to its kernel traits when it repacks, NULL otherwise.
bool buft_takes(ggml_backend_buffer_type_t buft, ggml_type type, int64_t ne0, int64_t ne1, int n_dims) {
    ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, true};
    std::unique_ptr<ggml_context, GgmlCtxFree> ctx(ggml_init(ip));
    if (!ctx) {
        throw Error("ggml_init failed");
    }
    const int64_t rows = 16 + ne1 % 16;
    ggml_tensor * t = n_dims == 3 ? ggml_new_tensor_3d(ctx.get(), type, ne0, rows, 2)
                                  : ggml_new_tensor_2d(ctx.get(), type, ne0, rows);
    const size_t size = ggml_backend_buft_get_alloc_size(buft, t) + ggml_backend_buft_get_alignment(buft);
    std::unique_ptr<ggml_backend_buffer, BufferFree> buf(ggml_backend_buft_alloc_buffer(buft, size));
    if (!buf) {
        throw Error(std::string("could not allocate a probe buffer of type ") + ggml_backend_buft_name(buft));
    }
    if (ggml_backend_tensor_alloc(buf.get(), t, ggml_backend_buffer_get_base(buf.get())) != GGML_STATUS_SUCCESS) {
        return false;
    }
    return t->extra != nullptr;
}

}  // namespace

BuildInvariance build_invariance() {
    ggml_backend_dev_t cpu = cpu_device();
    BuildInvariance b;
    auto features = reinterpret_cast<ggml_backend_get_features_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu), "ggml_backend_get_features"));
    if (features != nullptr) {
        // "LLAMAFILE" is ggml_cpu_has_llamafile() of the CPU backend that is loaded
        for (ggml_backend_feature * f = features(ggml_backend_dev_backend_reg(cpu)); f->name != nullptr; ++f) {
            const bool on = std::strcmp(f->value, "0") != 0;
            b.llamafile = b.llamafile || (on && std::strcmp(f->name, "LLAMAFILE") == 0);
            b.repack = b.repack || (on && std::strcmp(f->name, "REPACK") == 0);
            b.matmul_int8 = b.matmul_int8 || (on && std::strcmp(f->name, "MATMUL_INT8") == 0);
        }
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            b.other_devices += (b.other_devices.empty() ? "" : ",") + std::string(ggml_backend_dev_name(dev));
        }
    }
    return b;
}

std::string target_weights_json(const char * path) {
    if (path == nullptr) {
        throw Error("path is NULL");
    }
    ggml_context * meta_raw = nullptr;
    gguf_init_params gp = {true, &meta_raw};
    std::unique_ptr<gguf_context, GgufFree> gguf(gguf_init_from_file(path, gp));
    std::unique_ptr<ggml_context, GgmlCtxFree> meta(meta_raw);
    if (!gguf || !meta) {
        throw Error(std::string("cannot read GGUF tensor metadata from ") + path);
    }
    const std::vector<ggml_backend_buffer_type_t> bufts = extra_bufts(cpu_device());
    const bool has_output = ggml_get_tensor(meta.get(), "output.weight") != nullptr;

    std::map<std::string, int64_t> types;
    std::map<std::string, int64_t> repacked;  // "<type>" -> count
    std::map<std::string, std::string> by_buft;  // "<type>" -> buffer type name
    std::map<std::tuple<int, int64_t, int64_t, int>, const char *> seen;  // probe cache
    for (ggml_tensor * t = ggml_get_first_tensor(meta.get()); t != nullptr; t = ggml_get_next_tensor(meta.get(), t)) {
        const int n_dims = ggml_n_dims(t);
        if (n_dims < 2) {
            continue;  // norms and biases: no matrix multiplication
        }
        const std::string tname = ggml_type_name(t->type);
        types[tname] += 1;
        // the token embedding is read with get_rows unless it doubles as the output head
        if (std::strcmp(ggml_get_name(t), "token_embd.weight") == 0 && has_output) {
            continue;
        }
        if (n_dims > 3 || ggml_blck_size(t->type) <= 0 || t->ne[0] % ggml_blck_size(t->type) != 0) {
            continue;
        }
        const auto key = std::make_tuple(static_cast<int>(t->type), t->ne[0], t->ne[1] % 16, n_dims);
        auto it = seen.find(key);
        if (it == seen.end()) {
            const char * taker = nullptr;
            for (ggml_backend_buffer_type_t buft : bufts) {
                if (buft_takes(buft, t->type, t->ne[0], t->ne[1], n_dims)) {
                    taker = ggml_backend_buft_name(buft);
                    break;
                }
            }
            it = seen.emplace(key, taker).first;
        }
        if (it->second != nullptr) {
            repacked[tname] += 1;
            by_buft[tname] = it->second;
        }
    }

    JsonWriter w;
    w.begin_object();
    w.key("types").begin_object();
    for (const auto & [k, v] : types) w.field(k, v);
    w.end_object();
    w.key("repacked").begin_object();
    for (const auto & [k, v] : repacked) w.field(k, v);
    w.end_object();
    w.key("repack_buffer").begin_object();
    for (const auto & [k, v] : by_buft) w.field(k, v);
    w.end_object();
    w.key("extra_buffer_types").begin_array();
    for (ggml_backend_buffer_type_t buft : bufts) w.value(ggml_backend_buft_name(buft));
    w.end_array();
    w.end_object();
    return w.str();
}

}  // namespace pdf2

extern "C" char * pdf2_target_weights_json(const char * path) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(pdf2::target_weights_json(path)); });
}
