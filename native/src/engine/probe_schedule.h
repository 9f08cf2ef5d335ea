// When to try an option the cost model does not choose (a chain while plain decoding wins, a tree
// while the chain does): an estimate learns only from the steps that run its option, so without a
// probe now and then it could never see the text get easier. One probe after `interval` steps
// without the option (16 at first), the interval doubling while probes keep confirming the choice
// (at most 512), and starting over once the option is chosen.
#pragma once

#include <algorithm>

namespace pdf2 {

class ProbeSchedule {
  public:
    // One step; chosen: the model chose the option. True: probe it this step.
    bool step(bool chosen) {
        if (chosen) {
            streak_ = 0;
            interval_ = FIRST;
            return false;
        }
        if (++streak_ < interval_) return false;
        streak_ = 0;
        interval_ = std::min(2 * interval_, MAX);
        return true;
    }

  private:
    static constexpr int FIRST = 16;
    static constexpr int MAX = 512;
    int streak_ = 0;
    int interval_ = FIRST;
};

}  // namespace pdf2
