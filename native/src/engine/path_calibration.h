// Calibration of estimated path probabilities against what verification accepted: a drafted node
// is accepted when the target's own choices follow its whole path, so per band of estimated path
// probability, accepted nodes over the probability they were given is the factor that turns an
// estimate into an expected acceptance. One per draft source (the lattice's selector scores, the
// context's match counts): each source's estimates are off in their own way.
#pragma once

#include <vector>

namespace pdf2 {

class PathCalibration {
  public:
    static constexpr int N_BANDS = 16;  // path probability 1..1/2, 1/2..1/4, ..., below 2^-15
    static int band_of(double logp);

    PathCalibration();
    // One verify: the log-probability estimates of the drafted nodes, and which were accepted.
    void observe(const std::vector<double> & logp, const std::vector<char> & accepted);
    double factor(int band) const;  // accepted over estimated, in one band
    // the calibrated acceptance of a node estimated at logp (at most 1)
    double calibrated(double logp) const;

  private:
    std::vector<double> hits_;  // per band: decayed accepted nodes
    std::vector<double> mass_;  // ... and their summed path probability
};

}  // namespace pdf2
