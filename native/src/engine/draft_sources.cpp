#include "engine/draft_sources.h"

#include "common/clock.h"
#include "common/errors.h"
#include "engine/repeat_draft_source.h"

#include <utility>

namespace pdf2 {

struct RegisteredSource {
    const char * name;
    std::unique_ptr<DraftSource> (*make)(SourceKit & kit);
};

// The registry: one line a source (a source in a file of its own may declare its maker there).
static const RegisteredSource REGISTRY[] = {
    {"context", [](SourceKit & k) -> std::unique_ptr<DraftSource> {
         return std::make_unique<ContextDraftSource>(k.context_acceptance, k.context_caches);
     }},
    {"repeat", [](SourceKit &) -> std::unique_ptr<DraftSource> { return std::make_unique<RepeatDraftSource>(); }},
    {"prompt-echo", [](SourceKit & k) { extern std::unique_ptr<DraftSource> make_prompt_echo(SourceKit &); return make_prompt_echo(k); }},
};

namespace {

// Times one call into a source's counters.
struct CallTimer {
    SourceStats & stats;
    Clock::time_point t0 = Clock::now();
    ~CallTimer() { stats.called(seconds_since(t0)); }
};

}  // namespace

std::unique_ptr<DraftSource> make_draft_source(const std::string & name, SourceKit & kit) {
    for (const RegisteredSource & r : REGISTRY) {
        if (name == r.name) return r.make(kit);
    }
    std::string known;
    for (const RegisteredSource & r : REGISTRY) known += std::string(known.empty() ? "" : ", ") + r.name;
    throw Error("unknown draft source '" + name + "' (known: " + known + ")");
}

std::vector<std::string> draft_source_names() {
    std::vector<std::string> out;
    for (const RegisteredSource & r : REGISTRY) out.emplace_back(r.name);
    return out;
}

void SlotSources::add(std::unique_ptr<DraftSource> source) {
    if (sources_.size() >= static_cast<size_t>(kMaxSources)) {
        throw Error("a slot holds at most " + std::to_string(kMaxSources) + " draft sources");
    }
    for (const auto & s : sources_) {
        if (std::string(s->name()) == source->name()) throw Error(std::string("draft source '") + source->name() + "' is already there");
    }
    source->set_index(size());
    sources_.push_back(std::move(source));
    stats_.emplace_back();
}

std::vector<const DraftSource *> SlotSources::all() const {
    std::vector<const DraftSource *> out;
    for (const auto & s : sources_) out.push_back(s.get());
    return out;
}

void SlotSources::begin(const SourceStart & start) {
    for (size_t i = 0; i < sources_.size(); ++i) {
        stats_[i].start_request();
        const CallTimer timer{stats_[i]};
        sources_[i]->begin(start);
    }
}

Offer SlotSources::offer(int index, const OfferRequest & req) {
    const CallTimer timer{stats_[static_cast<size_t>(index)]};
    return sources_[static_cast<size_t>(index)]->offer(req);
}

std::vector<Offer> SlotSources::offers(const OfferRequest & req) {
    std::vector<Offer> out;
    out.reserve(sources_.size());
    for (int i = 0; i < size(); ++i) out.push_back(offer(i, req));
    return out;
}

void SlotSources::draft(int index, const DraftRequest & req, DraftBlock & out) {
    {
        const CallTimer timer{stats_[static_cast<size_t>(index)]};
        sources_[static_cast<size_t>(index)]->draft(req, out);
    }
    out.source = index;
}

void SlotSources::accept(const Verified & v) {
    for (size_t i = 0; i < sources_.size(); ++i) {
        count(static_cast<int>(i), v);
        const CallTimer timer{stats_[i]};
        sources_[i]->accept(v);
    }
}

void SlotSources::finish() {
    for (size_t i = 0; i < sources_.size(); ++i) {
        const CallTimer timer{stats_[i]};
        sources_[i]->finish();
    }
}

// A source's nodes in a verified block: a chain is the source's that drafted it (its first
// n_committed - 1 drafts accepted); a tree's nodes are those of its origin bit (an unmerged tree:
// all of them, when it drafted it).
void SlotSources::count(int index, const Verified & v) {
    if (v.block == nullptr || v.block->tokens.empty()) return;
    const DraftBlock & b = *v.block;
    SourceStats & st = stats_[static_cast<size_t>(index)];
    if (!b.is_tree) {
        if (b.source != index) return;
        const auto k = static_cast<int64_t>(v.n_committed) - 1;
        st.add(static_cast<int64_t>(b.tokens.size()), k);
        for (int64_t d = 1; d <= k; ++d) st.count_depth(static_cast<int>(d));
        return;
    }
    const uint8_t bit = static_cast<uint8_t>(1u << index);
    int64_t nodes = 0, accepted = 0;
    for (int node = 0; node < b.tree.size(); ++node) {
        const auto i = static_cast<size_t>(node);
        if (b.is_merged() ? (b.origin[i] & bit) == 0 : b.source != index) continue;
        nodes += 1;
        if (!(*v.node_accepted)[i]) continue;
        accepted += 1;
        st.count_depth(b.tree.depth[i]);
    }
    st.add(nodes, accepted);
}

}  // namespace pdf2
