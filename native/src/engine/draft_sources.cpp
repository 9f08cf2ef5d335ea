#include "engine/draft_sources.h"

#include "common/errors.h"
#include "engine/repeat_draft_source.h"

#include <utility>

namespace pdf2 {

namespace {

struct Registered {
    const char * name;
    std::unique_ptr<DraftSource> (*make)(SourceKit & kit);
};

// The registry: one line a source.
const Registered REGISTRY[] = {
    {"context", [](SourceKit & k) -> std::unique_ptr<DraftSource> {
         return std::make_unique<ContextDraftSource>(k.context_acceptance, k.context_caches);
     }},
    {"repeat", [](SourceKit &) -> std::unique_ptr<DraftSource> { return std::make_unique<RepeatDraftSource>(); }},
};

}  // namespace

std::unique_ptr<DraftSource> make_draft_source(const std::string & name, SourceKit & kit) {
    for (const Registered & r : REGISTRY) {
        if (name == r.name) return r.make(kit);
    }
    std::string known;
    for (const Registered & r : REGISTRY) known += std::string(known.empty() ? "" : ", ") + r.name;
    throw Error("unknown draft source '" + name + "' (known: " + known + ")");
}

std::vector<std::string> draft_source_names() {
    std::vector<std::string> out;
    for (const Registered & r : REGISTRY) out.emplace_back(r.name);
    return out;
}

void SlotSources::set_lattice(std::unique_ptr<DFlashDraftSource> lattice) {
    lattice_ = std::move(lattice);
    if (lattice_ != nullptr) lattice_->set_index(0);
    std::vector<DraftSource *> c;
    for (const auto & s : candidates_) c.push_back(s.get());
    merged_.set_sources(lattice_.get(), c);
}

void SlotSources::add(std::unique_ptr<DraftSource> source) {
    if (candidates_.size() + 1 >= static_cast<size_t>(kMaxSources)) {
        throw Error("a slot holds at most " + std::to_string(kMaxSources - 1) + " candidate draft sources");
    }
    for (const auto & s : candidates_) {
        if (std::string(s->name()) == source->name()) throw Error(std::string("draft source '") + source->name() + "' is already there");
    }
    source->set_index(static_cast<int>(candidates_.size()) + 1);
    candidates_.push_back(std::move(source));
    set_lattice(std::move(lattice_));
}

std::vector<const DraftSource *> SlotSources::all() const {
    std::vector<const DraftSource *> out{lattice_.get()};
    for (const auto & s : candidates_) out.push_back(s.get());
    return out;
}

void SlotSources::begin(const SourceStart & start) {
    if (lattice_ != nullptr) lattice_->begin(start);
    for (const auto & s : candidates_) s->begin(start);
}

void SlotSources::accept(const Verified & v) {
    if (lattice_ != nullptr) lattice_->accept(v);
    for (const auto & s : candidates_) s->accept(v);
}

void SlotSources::finish() {
    if (lattice_ != nullptr) lattice_->finish();
    for (const auto & s : candidates_) s->finish();
}

}  // namespace pdf2
