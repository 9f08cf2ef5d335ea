#include "engine/slot.h"

#include <algorithm>
#include <utility>

namespace pdf2 {

void Slot::begin(const std::vector<llama_token> & prompt, std::unique_ptr<TargetSampler> sampler, int32_t max_tokens,
                 int32_t keep) {
    request.sampler = std::move(sampler);
    request.prompt = prompt;
    seq.history = prompt;  // positions >= keep are prefilled next
    seq.prompt_rows = static_cast<int32_t>(prompt.size());
    seq.n_prefilled = keep;
    seq.pos = 0;
    seq.anchor = -1;
    request.max_tokens = max_tokens;
    drafting.sources.begin(
        SourceStart{&prompt, static_cast<int>(context_mode), &context_key, !request.sampler->params().greedy()});
    state = State::Prefill;
}

void Slot::start_decoding(llama_token first) {
    state = State::Decode;
    seq.pos = seq.n_prefilled;
    seq.anchor = first;
}

void Slot::end() {
    // what the sequence holds: the prefilled prompt rows, or every committed row
    const int32_t held = state == State::Prefill ? seq.n_prefilled : seq.pos - static_cast<int32_t>(seq.pending.size());
    seq.pending.clear();
    seq.history.resize(static_cast<size_t>(std::min<int32_t>(held, static_cast<int32_t>(seq.history.size()))));
    state = State::Idle;
    drafting.sources.finish();  // the context's output joins the global cache
    request.prompt.clear();
    request.sampler.reset();
}

bool Slot::fill(int32_t n_ctx) {
    if (state != State::Decode || seq.pos < n_ctx) return false;
    state = State::Full;
    return true;
}

void Slot::commit(const std::vector<llama_token> & accepted, llama_token next) {
    seq.history.push_back(seq.anchor);
    seq.history.insert(seq.history.end(), accepted.begin(), accepted.end());
    seq.pos += static_cast<int32_t>(accepted.size()) + 1;
    seq.anchor = next;
}

}  // namespace pdf2
