// C API of the chain's formula (draft_length.h) and the acceptance prior (step_price.h): a chain's
// expected committed tokens from its positions' acceptance (training reads it).
#include <cmath>
#include <vector>

#include "common/errors.h"
#include "engine/draft_length.h"
#include "pydflash2.h"

extern "C" double pdf2_draft_prior_reached(void) { return pdf2::PRIOR_REACHED; }

extern "C" double pdf2_draft_prior_accepted(void) { return pdf2::PRIOR_ACCEPTED; }

extern "C" double pdf2_expected_tokens(const double * acceptance, int32_t n) {
    return pdf2::guarded<double>(-1.0, [&]() -> double {
        if (n < 0 || (n > 0 && acceptance == nullptr)) throw pdf2::Error("expected_tokens: need n >= 0 acceptances");
        for (int32_t i = 0; i < n; ++i) {
            if (!(acceptance[i] >= 0.0 && acceptance[i] <= 1.0)) {
                throw pdf2::Error("expected_tokens: acceptances must be in [0, 1]");
            }
        }
        return pdf2::expected_tokens(std::vector<double>(acceptance, acceptance + n), n);
    });
}
