// Deliberate defects, for benchmarks/mutation_check.py only: it breaks the engine on purpose, one
// way at a time, and shows that the fast test tier catches each. Off unless the environment
// variable PYDFLASH2_MUTATION names one (read once per process); never set it in use.
#pragma once

namespace pdf2 {

enum class Mutation {
    None,
    SkipPenalties,     // "skip_penalties": the penalty sampler is left out of the chain
    SkipGrammar,       // "skip_grammar": the grammar is left out of the chain
    AcceptExtraDraft,  // "accept_extra_draft": a chain verify keeps the first rejected draft too
    WrongTreeBranch,   // "wrong_tree_branch": a tree verify follows another child than the target chose
    QForP,             // "q_for_p": rejection sampling reads the drafter's q where the target's p belongs
};

Mutation active_mutation();

}  // namespace pdf2
