// pdf2_native_info_json: what ggml/llama this process runs and which ggml
// backend devices it offers (CPU always; CUDA/Metal when llama-cpp-python was
// built with them).
#include "engine/batch_invariance.h"
#include "common/devices.h"
#include "common/errors.h"
#include "common/json_writer.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <llama.h>

#include "pydflash2.h"

namespace {

std::string native_info_json() {
    // make sure the backends are registered the way llama.cpp registers them
    llama_backend_init();

    pdf2::JsonWriter w;
    w.begin_object();
    w.field("ggml_version", ggml_version());
    w.field("ggml_commit", ggml_commit());
    w.field("llama_system_info", llama_print_system_info());
    w.field("supports_gpu_offload", llama_supports_gpu_offload());
    w.field("supports_mmap", llama_supports_mmap());
    // Build-level batch invariance: no llamafile sgemm in the CPU backend and no
    // other backend that could run the target (GPU kernels depend on the batch
    // size). The target's weight types and flash attention refine this per
    // model (pydflash2/exactness.py).
    const pdf2::BuildInvariance bi = pdf2::build_invariance();
    std::string reason;
    if (bi.llamafile) {
        reason = "the CPU backend uses llamafile sgemm for batches > 1 (built with GGML_LLAMAFILE=ON)";
    } else if (bi.matmul_int8) {
        // vec_dot nrows = 2 for Q4_0/Q4_1/Q8_0... on i8mm CPUs: batches pair rows, a batch of one cannot
        reason = "the CPU's int8 matrix-multiply kernels (ARM i8mm) pair rows in batches";
    } else if (!bi.other_devices.empty()) {
        reason = "non-CPU backend devices present (" + bi.other_devices + "): their kernels depend on the batch size";
    }
    w.field("llamafile", bi.llamafile);
    w.field("cpu_repack", bi.repack);
    w.field("batch_invariant", reason.empty());
    w.field("batch_invariant_reason", reason);
    w.key("devices").begin_array();
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        size_t free_mem = 0;
        size_t total_mem = 0;
        ggml_backend_dev_memory(dev, &free_mem, &total_mem);
        w.begin_object();
        w.field("name", ggml_backend_dev_name(dev));
        w.field("description", ggml_backend_dev_description(dev));
        w.field("type", pdf2::device_type_name(ggml_backend_dev_type(dev)));
        w.field("backend", ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)));
        w.field("memory_free", static_cast<uint64_t>(free_mem));
        w.field("memory_total", static_cast<uint64_t>(total_mem));
        w.end_object();
    }
    w.end_array();
    w.end_object();
    return w.str();
}

}  // namespace

extern "C" char * pdf2_native_info_json(void) {
    return pdf2::guarded<char *>(nullptr, [] { return pdf2::dup_string(native_info_json()); });
}

