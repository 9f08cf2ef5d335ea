// A slot's draft sources, and the registry of the sources an engine can merge. Each source is one
// file (draft_source.h's interface); adding one is a line in draft_sources.cpp's registry. The
// slot tells every source of each request's start and end and of every verified step, so each
// learns from and counts what concerns it; the merged tree (merged_draft_source.h) takes their
// offers.
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
    ContextCaches context_caches;        // past outputs per API key (ContextDrafts::Global)
};

// A candidate source by its registered name ("context", "repeat"); throws for an unknown name.
std::unique_ptr<DraftSource> make_draft_source(const std::string & name, SourceKit & kit);
std::vector<std::string> draft_source_names();

class SlotSources {
  public:
    // The drafter's lattice: source index 0 (a slot without a drafter leaves it empty).
    void set_lattice(std::unique_ptr<DFlashDraftSource> lattice);
    // A candidate source: the next index (at most kMaxSources in all).
    void add(std::unique_ptr<DraftSource> source);

    DFlashDraftSource * lattice() { return lattice_.get(); }
    bool has_candidates() const { return !candidates_.empty(); }
    MergedDraftSource & merged() { return merged_; }
    // every source by index (index 0 null without a drafter)
    std::vector<const DraftSource *> all() const;

    void begin(const SourceStart & start);
    void accept(const Verified & v);
    void finish();

  private:
    std::unique_ptr<DFlashDraftSource> lattice_;
    std::vector<std::unique_ptr<DraftSource>> candidates_;
    MergedDraftSource merged_;
};

}  // namespace pdf2
