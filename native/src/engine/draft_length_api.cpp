// C API of the cost model (step_price.h, draft_length.h): the numbers behind n_max = auto, for
// explaining a decision, and the acceptance prior.
#include <cmath>
#include <vector>

#include "common/errors.h"
#include "engine/draft_length.h"
#include "pydflash2.h"

extern "C" int32_t pdf2_draft_length_rates(const double * verify_s, int32_t n_verify, const double * draft_s,
                                           int32_t n_draft, const double * acceptance, double * expected_tokens,
                                           double * rate) {
    return pdf2::guarded<int32_t>(-1, [&]() -> int32_t {
        if (verify_s == nullptr || acceptance == nullptr || expected_tokens == nullptr || rate == nullptr ||
            (n_draft > 0 && draft_s == nullptr) || n_draft < 0 || n_verify != n_draft + 1) {
            throw pdf2::Error("draft_length_rates: need n_draft + 1 verify costs, n_draft draft costs and "
                              "n_draft acceptances");
        }
        for (int32_t i = 0; i < n_verify; ++i) {
            if (!std::isfinite(verify_s[i]) || verify_s[i] <= 0.0) {
                throw pdf2::Error("draft_length_rates: verify costs must be finite and > 0");
            }
        }
        for (int32_t i = 0; i < n_draft; ++i) {
            if (!std::isfinite(draft_s[i]) || draft_s[i] < 0.0 || !(acceptance[i] >= 0.0 && acceptance[i] <= 1.0)) {
                throw pdf2::Error("draft_length_rates: draft costs must be finite and >= 0, acceptances in [0, 1]");
            }
        }
        pdf2::StepCosts costs;
        costs.verify_s.assign(verify_s, verify_s + n_verify);
        costs.draft_s.assign(draft_s, draft_s + n_draft);
        const std::vector<double> accept(acceptance, acceptance + n_draft);
        for (int32_t n = 0; n <= n_draft; ++n) {
            expected_tokens[n] = pdf2::expected_tokens(accept, n);
            rate[n] = pdf2::expected_rate(accept, costs, n);
        }
        return pdf2::best_draft_length(accept, costs);
    });
}

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
