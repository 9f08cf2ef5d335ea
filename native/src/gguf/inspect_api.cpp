// C entry point for drafter inspection (contract check without loading weights).
#include "gguf/dflash_contract.h"
#include "common/errors.h"

#include "pydflash2.h"

extern "C" char * pdf2_inspect_drafter_json(const char * path) {
    return pdf2::guarded<char *>(nullptr, [&] {
        if (path == nullptr) {
            throw pdf2::Error("path is NULL");
        }
        return pdf2::dup_string(pdf2::hparams_to_json(pdf2::inspect_drafter_file(path)));
    });
}
