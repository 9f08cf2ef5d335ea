// Is the target's forward batch-invariant on this ggml? Speculative
// verification decodes [anchor, drafts...] as one batch where plain decoding
// decodes one token at a time; the outputs are identical only when every row
// of a batch is computed with the same kernels, in the same order, as a
// batch of one. These are the facts the decision needs (Python combines them
// with the target's own settings in pydflash2/exactness.py).
#pragma once

#include <string>

namespace pdf2 {

struct BuildInvariance {
    bool llamafile = false;   // CPU backend built with llamafile sgemm (batch > 1 takes another kernel)
    bool repack = false;      // CPU backend can repack weights (gemm for batches >= 4, gemv below)
    bool matmul_int8 = false;  // ARM i8mm: quantized dot products take 2x2 rows/columns in batches
    std::string other_devices;  // non-CPU ggml devices present (comma list), "" if none
};

BuildInvariance build_invariance();

// JSON: {"types": {"q4_0": n, ...}, "repacked": {"q4_0": n, ...}} for the
// weight tensors of a GGUF model file: their ggml types and how many of each
// the CPU backend would repack into interleaved layouts on this machine (asked
// of ggml's own CPU_REPACK buffer type, with stand-in tensors of the same type
// and row-count residue). Reads tensor metadata only.
std::string target_weights_json(const char * path);

}  // namespace pdf2
