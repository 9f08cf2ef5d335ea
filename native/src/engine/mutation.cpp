#include "engine/mutation.h"

#include <cstdlib>
#include <cstring>

namespace pdf2 {

Mutation active_mutation() {
    static const Mutation m = [] {
        const char * name = std::getenv("PYDFLASH2_MUTATION");
        if (name == nullptr) return Mutation::None;
        const struct {
            const char * name;
            Mutation m;
        } known[] = {{"skip_penalties", Mutation::SkipPenalties},
                     {"skip_grammar", Mutation::SkipGrammar},
                     {"accept_extra_draft", Mutation::AcceptExtraDraft},
                     {"wrong_tree_branch", Mutation::WrongTreeBranch},
                     {"q_for_p", Mutation::QForP}};
        for (const auto & k : known) {
            if (std::strcmp(name, k.name) == 0) return k.m;
        }
        return Mutation::None;
    }();
    return m;
}

}  // namespace pdf2
