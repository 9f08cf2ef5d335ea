#include "engine/batch_engine.h"

#include "common/json_writer.h"

#include <map>
#include <string>

namespace pdf2 {

namespace {

// A decision of the cost model as it was made: what it chose among, every option with its price
// (expected tokens summed over n_slots, the step's seconds, their rate), and the option it took.
void write_decision(JsonWriter & w, const Decision & d) {
    w.begin_object();
    w.field("what", d.what);
    w.field("chosen", d.choice() != nullptr ? d.choice()->name() : std::string());
    w.field("probe", d.probe);
    w.key("options").begin_array();
    for (const PricedOption & o : d.options) {
        w.begin_object();
        w.field("plan", o.name());
        w.field("drafts", o.drafts);
        w.field("tree_budget", o.tree_budget);
        w.field("expected_tokens", o.price.committed);
        w.field("seconds", o.price.seconds);
        w.field("rate", d.priced ? o.price.rate() : 0.0);
        w.end_object();
    }
    w.end_array();
    w.field("priced", d.priced);
    w.field("slot", d.slot);
    w.field("n_slots", d.n_slots);
    w.end_object();
}

}  // namespace

// The step ledger (step_ledger.h): every part's seconds, the steps and their rows; and the phases
// the ledger's parts make (sums of parts: the same figures the engine reported before the ledger).
void BatchEngine::write_ledger(JsonWriter & w) const {
    const StepLedger & l = stats_.engine().ledger;
    const auto sec = [&](std::initializer_list<Part> parts) {
        double t = 0.0;
        for (const Part p : parts) t += l.seconds(p);
        return t;
    };
    w.key("ledger").begin_object();
    w.field("steps", l.steps());
    w.field("rows", l.rows());
    for (size_t i = 0; i < kParts; ++i) w.field(std::string(part_name(static_cast<Part>(i))) + "_s", l.seconds(static_cast<Part>(i)));
    w.end_object();
    const double verify_decode = sec({Part::Decode, Part::Sync, Part::Head});
    w.field("draft_s", sec({Part::Offers, Part::Propose, Part::GraphSetup, Part::Select}));
    w.field("decode_s", verify_decode + sec({Part::Prefill}));
    w.field("inject_s", sec({Part::Features, Part::Inject}));
    w.field("propose_s", sec({Part::Propose}));
    w.field("select_s", sec({Part::Select}));
    w.field("verify_decode_s", verify_decode);
    w.field("prefill_decode_s", sec({Part::Prefill}));
    w.field("verify_logic_s", sec({Part::Verify, Part::Kv}));
    w.field("graph_setup_s", sec({Part::GraphSetup}));
    w.field("step_s", l.total());
    w.field("host_s", l.host());  // the ledger's host parts (step_ledger.h, is_host)
}

// Drafts by source, each source's own counters (a node two sources proposed counts for both):
// one slot's request, or (slot null) the engine's since creation over all slots.
void BatchEngine::write_source_stats(JsonWriter & w, const Slot * slot) const {
    std::map<std::string, SourceCounts> by_name;
    std::map<std::string, std::vector<int64_t>> per_depth;
    std::map<std::string, std::pair<int64_t, double>> calls;  // every call the dispatcher made, its seconds
    for (const Slot & s : slots_) {
        if (slot != nullptr && &s != slot) continue;
        const SlotSources & sources = s.sources();
        for (int i = 0; i < sources.size(); ++i) {
            const std::string name = sources.all()[static_cast<size_t>(i)]->name();
            const SourceStats & st = sources.stats(i);
            const SourceCounts & c = slot != nullptr ? st.request : st.total;
            SourceCounts & sum = by_name[name];
            sum.nodes += c.nodes;
            sum.accepted += c.accepted;
            sum.steps += c.steps;
            calls[name].first += st.calls;
            calls[name].second += st.seconds;
            std::vector<int64_t> & d = per_depth[name];
            const std::vector<int64_t> & own = st.accepted_per_depth;
            if (d.size() < own.size()) d.resize(own.size(), 0);
            for (size_t j = 0; j < own.size(); ++j) d[j] += own[j];
        }
    }
    w.key("sources").begin_object();
    for (const auto & [name, c] : by_name) {
        w.key(name).begin_object();
        w.field("drafted", c.nodes);
        w.field("accepted", c.accepted);
        w.field("steps", c.steps);
        if (slot == nullptr) {
            w.key("accepted_per_depth").begin_array();
            for (const int64_t x : per_depth[name]) w.value(x);
            w.end_array();
            w.field("calls", calls[name].first);
            w.field("seconds", calls[name].second);
        }
        w.end_object();
    }
    w.end_object();
}

// The context's figures (the lattice's and the context's drafts beside each other), and the global cache.
void BatchEngine::write_context_stats(JsonWriter & w) const {
    SourceCounts lattice, context;
    std::vector<int64_t> context_per_depth(static_cast<size_t>(step_width_), 0);
    for (const Slot & s : slots_) {
        const SlotSources & sources = s.sources();
        for (int i = 0; i < sources.size(); ++i) {
            const std::string name = sources.all()[static_cast<size_t>(i)]->name();
            if (name != "context" && name != "lattice") continue;
            const SourceStats & st = sources.stats(i);
            SourceCounts & sum = name == "context" ? context : lattice;
            sum.nodes += st.total.nodes;
            sum.accepted += st.total.accepted;
            if (name == "lattice") continue;
            const std::vector<int64_t> & own = st.accepted_per_depth;
            for (size_t j = 0; j < own.size() && j < context_per_depth.size(); ++j) context_per_depth[j] += own[j];
        }
    }
    w.key("context").begin_object();
    w.field("max_nodes", opts_.context_nodes);
    w.field("lattice_nodes", lattice.nodes);
    w.field("lattice_accepted", lattice.accepted);
    w.field("context_nodes", context.nodes);
    w.field("context_accepted", context.accepted);
    w.field("context_steps", stats_.engine().n_context_steps);
    w.field("propose_skipped", stats_.engine().n_propose_skipped);
    w.key("context_accepted_per_depth").begin_array();
    for (const int64_t x : context_per_depth) w.value(x);
    w.end_array();
    w.field("cache_keys", static_cast<int64_t>(source_kit_.context_caches.n_keys()));
    w.field("cache_documents", static_cast<int64_t>(source_kit_.context_caches.n_documents()));
    w.field("cache_tokens", static_cast<int64_t>(source_kit_.context_caches.n_tokens()));
    w.end_object();
}

// the LM head the verifies run and how it was chosen (lazy_head.h)
void BatchEngine::write_head_stats(JsonWriter & w) const {
    w.field("lazy_head_rows", target_.lazy_head_rows());  // verify rows whose LM head ran (lazily)
    w.field("lazy_head_rows_read", target_.lazy_head_rows_read());  // of those, rows a verify read
    w.field("lazy_head_group", target_.head_rows());      // rows per head product (0: not chosen yet)
    // whether verify decodes stop before the LM head (and why not, once tried and refused)
    w.field("lazy_head", verifies_cut_head() && (feed_drafters_ || opts_.context_nodes > 0));
    // the head the verifies run: "lazy" (cut before the head, rows run as read), "full" (every row's
    // head in the decode's graph) or "full up to N rows" (smaller verifies full, larger lazy), and how
    // it was chosen: "costs" (the measured tables, lazy_head.h choose_head), "set" (set_head_mode, a
    // lazy head group, exact batches), or "only" (no lazy head here, or no tables to choose by)
    w.field("head", !verifies_cut_head()  ? std::string("full")
                    : full_head_rows_ < 2 ? std::string("lazy")
                                          : "full up to " + std::to_string(full_head_rows_) + " rows");
    w.field("head_chosen_by", head_capture_ == nullptr ? "only"
                              : head_mode_ != HeadMode::Auto || target_.forced_head_rows() > 0 ? "set"
                              : head_choice_.measured                                        ? "costs"
                                                                                             : "only");
    w.field("full_head_rows", static_cast<int64_t>(std::min(full_head_rows_, max_verify_rows())));
    // what choose_head compared: the full head's extra over the lazy table at 2 rows and where it
    // stopped, against one row's product
    w.field("head_full_extra_s", head_choice_.extra_s);
    w.field("head_full_extra_last_s", head_choice_.extra_last_s);
    if (!target_.lazy_head_error().empty()) {
        w.field("lazy_head_error", target_.lazy_head_error());
    }
}

std::string BatchEngine::stats_json() const {
    JsonWriter w;
    w.begin_object();
    w.field("n_slots", static_cast<int64_t>(slots_.size()));
    w.field("max_draft", max_draft_);
    w.field("n_steps", stats_.engine().n_steps);
    w.field("n_rows", stats_.engine().n_rows);
    w.field("n_filler_rows", stats_.engine().n_filler_rows);
    write_head_stats(w);
    w.field("n_prompt", stats_.engine().n_prompt);
    w.field("n_prompt_reused", stats_.engine().n_prompt_reused);
    w.field("n_generated", stats_.engine().n_generated);
    w.field("n_drafts", stats_.engine().n_drafts);
    w.field("n_draft_tokens", stats_.engine().n_draft_tokens);
    w.field("n_accepted", stats_.engine().n_accepted);
    w.field("unfed_steps", stats_.engine().n_unfed_steps);  // plain steps that skipped the drafter's features
    w.field("plain_s", cost_model_.costs().plain_s);
    w.field("head_s", cost_model_.costs().head_s);
    // the host work per step the prices add, learned from the ledger (cost_model.h)
    const HostCosts & host = cost_model_.costs().host;
    w.key("host_costs").begin_object();
    w.field("plain_per_slot_s", host.plain_per_slot);
    w.field("draft_base_s", host.draft_base);
    w.field("draft_per_row_s", host.draft_per_row);
    w.end_object();
    // the tables as the steps saw them (learned costs only): a plain step's device seconds (0: none
    // seen) and the verify decodes' against the table
    const DeviceCorrection & seen = cost_model_.costs().seen;
    w.key("device_seen").begin_object();
    w.field("plain_s", seen.plain);
    w.field("verify_scale", seen.verify_scale);
    w.end_object();
    // the verify and plain decodes by rows as they ran (engine_stats.h): counts and seconds
    const BatchStats & e = stats_.engine();
    w.array_field("decodes_by_rows", e.decodes_by_rows);
    w.array_field("decode_s_by_rows", e.decode_s_by_rows);
    w.array_field("fed_decodes_by_rows", e.fed_decodes_by_rows);
    w.array_field("fed_decode_s_by_rows", e.fed_decode_s_by_rows);
    write_ledger(w);
    w.field("drafter_graph_builds", stats_.engine().n_graph_builds);
    w.key("accepted_per_position").begin_array();
    for (const int64_t x : stats_.engine().accepted_per_pos) w.value(x);
    w.end_array();
    if (opts_.context_nodes > 0) {
        write_context_stats(w);
    }
    write_source_stats(w, nullptr);
    int64_t busy = 0;

    for (const Slot & s : slots_) busy += s.state() == State::Idle ? 0 : 1;
    w.field("busy_slots", busy);
    if (cost_model_.max_tree_budget() > 0) cost_model_.write_json(w);
    // the cost model's decisions at the last step that verified rows: every option priced, the chosen one
    w.key("decisions").begin_array();
    for (const Decision & d : stats_.engine().decisions) write_decision(w, d);
    w.end_array();
    w.end_object();
    return w.str();
}

std::string BatchEngine::slot_stats_json(int slot) {
    Slot & s = slot_at(slot);
    const SlotStats & st = s.request().stats;
    JsonWriter w;
    w.begin_object();
    w.field("n_prompt", st.n_prompt);
    w.field("n_reused", st.n_reused);
    w.field("n_generated", st.n_generated);
    w.field("n_steps", st.n_steps);
    w.field("n_spec_steps", st.n_spec_steps);
    const int64_t after_first = std::max<int64_t>(0, st.n_generated - 1);
    w.field("tau", st.n_steps > 0 ? static_cast<double>(after_first) / static_cast<double>(st.n_steps) : 0.0);
    w.field("max_draft", max_draft_);
    w.array_field("drafted_per_position", st.drafted);
    w.array_field("accepted_per_position", st.accepted);
    w.array_field("n_max_histogram", st.n_max_used);
    w.field("n_tree_steps", st.n_tree_steps);
    SourceCounts lattice, context;
    std::vector<double> acceptance;  // the proposing source's chain acceptance (its offer)
    SlotSources & sources = s.sources();  // (offer() asks the sources: not const)
    for (int i = 0; i < sources.size(); ++i) {
        const std::string name = sources.all()[static_cast<size_t>(i)]->name();
        if (name == "lattice") lattice = sources.stats(i).request;
        if (name == "context") context = sources.stats(i).request;
        if (acceptance.empty()) acceptance = sources.offer(i, OfferRequest{}).chain_acceptance;
    }
    w.field("lattice_drafted", lattice.nodes);
    w.field("lattice_accepted", lattice.accepted);
    w.field("context_drafted", context.nodes);
    w.field("context_accepted", context.accepted);
    w.field("context_steps", st.n_context_steps);
    w.field("propose_skipped", st.n_propose_skipped);
    write_source_stats(w, &s);
    w.key("acceptance_estimate").begin_array();
    for (const double a : acceptance) w.value(a);
    w.end_array();
    // the plans its verify steps ran (engine_stats.h): what the engine chose, expected and measured
    w.key("plans").begin_array();
    for (const PlanRun & r : st.plans) {
        w.begin_object();
        w.field("plan", r.plan);
        w.field("steps", r.steps);
        w.field("expected_tau", r.steps > 0 ? r.expected / static_cast<double>(r.steps) : 0.0);
        w.field("tau", r.steps > 0 ? static_cast<double>(r.committed) / static_cast<double>(r.steps) : 0.0);
        // where it ran as the cost model chose it: the rates it priced it and plain decoding at
        const auto mean = [&](double sum) { return r.priced_steps > 0 ? sum / static_cast<double>(r.priced_steps) : 0.0; };
        w.field("priced_steps", r.priced_steps);
        w.field("expected_rate", mean(r.rate));
        w.field("plain_rate", mean(r.plain_rate));
        w.end_object();
    }
    w.end_array();
    w.key("decision");  // the last decision its plan came from (null: none, e.g. a fixed n_max)
    if (st.decision.chosen >= 0) {
        write_decision(w, st.decision);
    } else {
        w.null();
    }
    w.end_object();
    return w.str();
}

}  // namespace pdf2
