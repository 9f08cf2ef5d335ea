// A slot's draft sources, and the registry of the sources an engine can add by name. Each source
// is one file (draft_source.h's interface); adding one is a line in draft_sources.cpp's registry.
// SlotSources is the dispatcher: every call to a source goes through it, which counts and times
// it (one clock) and counts each source's nodes in the verified blocks, so a source only drafts,
// offers and learns. It tells every source of each request's start and end and of every verified
// step; the merged tree (merged_draft_source.h) takes their offers through it.
#pragma once

#include "engine/context_draft_source.h"
#include "engine/dflash_draft_source.h"
#include "engine/draft_source.h"
#include "engine/merged_draft_source.h"

#include <memory>
#include <string>
#include <vector>

namespace pdf2 {

// What a kind of source learns across the engine's slots (each source gets the engine's kit).
struct SourceKit {
    ByRegime<MatchAcceptance> context_acceptance;  // the context's acceptance by match length
    ContextCaches context_caches;                  // past outputs per API key (ContextDrafts::Global)
    ByRegime<LatticeKit> lattice;                  // the drafter's chains and trees (the engine's setup sizes it)
};

// A source by its registered name ("context", "repeat"); throws for an unknown name.
std::unique_ptr<DraftSource> make_draft_source(const std::string & name, SourceKit & kit);
std::vector<std::string> draft_source_names();

class SlotSources {
  public:
    // The next source index (at most kMaxSources in all; names unique).
    void add(std::unique_ptr<DraftSource> source);
    int size() const { return static_cast<int>(sources_.size()); }
    // every source by index, and its counters
    std::vector<const DraftSource *> all() const;
    const SourceStats & stats(int index) const { return stats_[static_cast<size_t>(index)]; }

    void begin(const SourceStart & start);
    Offer offer(int index, const OfferRequest & req);
    // every source's offer, by index
    std::vector<Offer> offers(const OfferRequest & req);
    // the block of source `index` (DraftBlock::source says whose)
    void draft(int index, const DraftRequest & req, DraftBlock & out);
    void accept(const Verified & v);
    void finish();

    MergedDraftSource & merged() { return merged_; }

  private:
    void count(int index, const Verified & v);  // the source's nodes in the verified block

    std::vector<std::unique_ptr<DraftSource>> sources_;
    std::vector<SourceStats> stats_;
    MergedDraftSource merged_;
};

}  // namespace pdf2
