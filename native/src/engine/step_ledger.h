// The step ledger: where the engine's time goes. Every part of BatchEngine::step() (and of the
// prompt chunks it prefills) is timed as one named part, exclusive of the parts timed inside it,
// so the parts add up to the step's time by construction and `other` holds what no part names.
// On a GPU the decode returns once the graph is launched and `sync` waits for the device; on a CPU
// `decode` is the forward. The host's share of a step is every part but decode, sync, prefill and
// the drafter's propose and inject graphs (docs/python-api.md, benchmarks/step_ledger.py).
#pragma once

#include "common/clock.h"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdf2 {

enum class Part : uint8_t {
    Plan,        // the planner: lengths, budgets, caps, which source
    Offers,      // the candidate sources' offers priced while planning (the context index's queries)
    Propose,     // the drafter's forward (device and host), after its graph setup
    GraphSetup,  // the drafter's graph builds and allocations
    Select,      // choosing the block: the path selector, tree building, merging, the prefix cut
    Build,       // laying the rows out in the batch
    Decode,      // llama_decode of verify rows (a CPU's whole forward; a GPU's launch)
    Sync,        // waiting for the device after the decode
    Head,        // the lazy LM head's products (the rows a verify reads)
    Verify,      // sampling and verification of each row, and reading its logits
    Kv,          // KV-cache bookkeeping: rejected rows, tree branches, filler rows
    Features,    // copying the committed rows' hidden states for the drafter
    Inject,      // the drafter's inject graph when it runs alone (not with a propose)
    Sources,     // telling the draft sources what was committed (the context index's appends)
    Prefill,     // prompt chunks: their rows, decode, features and first token (every part inside)
    Other,       // the rest of the step: commits, counters
    Count,
};
inline constexpr size_t kParts = static_cast<size_t>(Part::Count);
const char * part_name(Part p);  // "plan", "offers", ...
// The host's share: every part but the target's forward (decode, sync, head, prefill) and the
// drafter's graphs (propose, inject): what a GPU cannot hide behind its decode.
bool is_host(Part p);

class StepLedger {
  public:
    using Clock = pdf2::Clock;

    // Times one part from construction to destruction, less the scopes and add()s inside it.
    // Inside a Prefill scope every part is Prefill: a prompt chunk's host work (hundreds of rows
    // built, their features copied) belongs to the prompt, not to the verify steps beside it.
    class Scope {
      public:
        Scope(StepLedger & ledger, Part part);
        ~Scope();
        Scope(const Scope &) = delete;
        Scope & operator=(const Scope &) = delete;

      private:
        StepLedger & ledger_;
        Part part_;
        bool opens_prefill_;
        Clock::time_point t0_;
    };

    // seconds measured elsewhere (the drafter's own timers) as `part`, taken out of the open scope
    void add(Part part, double seconds);
    double seconds(Part part) const { return seconds_[static_cast<size_t>(part)]; }
    double total() const;  // all parts: the steps' time
    double host() const;   // the host parts (is_host)
    // a step ended: counts it and its rows (the parts above are sums over all steps)
    void end_step(int64_t rows) {
        steps_ += 1;
        rows_ += rows;
    }
    int64_t steps() const { return steps_; }
    int64_t rows() const { return rows_; }

  private:
    std::array<double, kParts> seconds_{};
    std::vector<double> inner_;  // per open scope: the seconds of what was timed inside it
    int prefill_open_ = 0;       // open Prefill scopes
    int64_t steps_ = 0, rows_ = 0;
};

}  // namespace pdf2
