#include "engine/path_calibration.h"

#include <algorithm>
#include <cmath>

namespace pdf2 {

namespace {
constexpr double DECAY = 0.97;      // as the draft length's: acceptance drifts with the text
constexpr double PRIOR_HITS = 1.0;  // the estimate is trusted until about one hit's worth is seen
}  // namespace

PathCalibration::PathCalibration() : hits_(N_BANDS, 0.0), mass_(N_BANDS, 0.0) {}

int PathCalibration::band_of(double logp) {
    if (!(logp < 0.0)) return 0;
    const double halvings = -logp / std::log(2.0);
    return std::min(N_BANDS - 1, static_cast<int>(halvings));
}

void PathCalibration::observe(const std::vector<double> & logp, const std::vector<char> & accepted) {
    for (int b = 0; b < N_BANDS; ++b) {
        hits_[static_cast<size_t>(b)] *= DECAY;
        mass_[static_cast<size_t>(b)] *= DECAY;
    }
    for (size_t i = 0; i < logp.size(); ++i) {
        const size_t band = static_cast<size_t>(band_of(logp[i]));
        mass_[band] += std::exp(logp[i]);
        hits_[band] += i < accepted.size() && accepted[i] ? 1.0 : 0.0;
    }
}

double PathCalibration::factor(int band) const {
    return (hits_[static_cast<size_t>(band)] + PRIOR_HITS) / (mass_[static_cast<size_t>(band)] + PRIOR_HITS);
}

double PathCalibration::calibrated(double logp) const {
    if (!std::isfinite(logp)) return 0.0;
    return std::min(1.0, std::exp(logp) * factor(band_of(logp)));
}

}  // namespace pdf2
