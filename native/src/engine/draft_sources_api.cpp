// C entry point of one registered draft source alone (tests and examples): a source is a function
// of the context it was told, so its offer and its blocks can be shown without a model.
#include "common/errors.h"
#include "engine/draft_sources.h"

#include "pydflash2.h"

#include <algorithm>
#include <string>
#include <vector>

extern "C" int pdf2_draft_source_block(const char * name, const int32_t * prompt, int32_t n_prompt,
                                       const int32_t * committed, int32_t n_committed, int32_t n,
                                       int32_t tree_budget, int32_t cap, int32_t * token, int32_t * parent,
                                       int32_t * n_nodes, int32_t * is_tree) {
    return pdf2::guarded<int>(-1, [&] {
        if (name == nullptr || n_nodes == nullptr || is_tree == nullptr || n_prompt < 0 || n_committed < 0 ||
            (n_prompt > 0 && prompt == nullptr) || (n_committed > 0 && committed == nullptr) || n < 0 ||
            tree_budget < 0 || cap < 0 || (cap > 0 && (token == nullptr || parent == nullptr))) {
            throw pdf2::Error("draft_source_block: bad arguments");
        }
        pdf2::SourceKit kit;
        pdf2::SlotSources sources;  // the dispatcher, as a slot has it
        sources.add(pdf2::make_draft_source(name, kit));
        const std::vector<llama_token> tokens(prompt, prompt + n_prompt);
        const std::string key;
        sources.begin(pdf2::SourceStart{&tokens, static_cast<int>(pdf2::ContextDrafts::Request), &key});
        if (n_committed > 0) {
            sources.accept(pdf2::Verified{committed, static_cast<size_t>(n_committed), nullptr, nullptr});
        }
        pdf2::DraftRequest req;
        req.anchor = n_committed > 0 ? committed[n_committed - 1] : (n_prompt > 0 ? prompt[n_prompt - 1] : -1);
        req.n = n;
        req.tree_budget = tree_budget;
        pdf2::OfferRequest offer;
        offer.max_depth = n;
        sources.offer(0, offer);  // what a step asks first (a source may gather its candidates there)
        pdf2::DraftBlock block;
        sources.draft(0, req, block);
        *n_nodes = static_cast<int32_t>(block.tokens.size());
        *is_tree = block.is_tree ? 1 : 0;
        const size_t k = std::min(block.tokens.size(), static_cast<size_t>(cap));
        for (size_t i = 0; i < k; ++i) {
            token[i] = block.tokens[i];
            parent[i] = block.is_tree ? block.tree.parent[i] : static_cast<int32_t>(i) - 1;
        }
        return 0;
    });
}
