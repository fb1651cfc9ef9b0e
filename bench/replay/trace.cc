// The trace generator: prompt structure first (sessions of requests), then arrival times.
#include "trace.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace cxlkv::replay {
namespace {

using Tokens = std::vector<std::uint32_t>;

struct Turn {
  Tokens prompt;
  Tokens output;
};
// Requests that follow each other after a think time (one request for api/oneshot).
struct Session {
  Workload workload;
  double think_s = 0;
  std::vector<Turn> turns;
};

class Gen {
 public:
  explicit Gen(std::uint64_t seed) : rng_(seed) {}
  std::uint32_t Uniform(std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng_);
  }
  double Unit() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  double Exp(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }
  // Fresh token ids: a vocabulary of 128k, so two independent spans never share a block.
  Tokens Fresh(std::uint32_t n) {
    Tokens t(n);
    for (auto& x : t) x = Uniform(0, 127999);
    return t;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

void Append(Tokens& to, const Tokens& from) { to.insert(to.end(), from.begin(), from.end()); }

std::vector<Session> Api(Gen& g, const WorkloadParams& p, std::uint32_t requests) {
  std::vector<Tokens> system;
  std::vector<double> weight;
  for (std::uint32_t i = 0; i < p.api_system_prompts; ++i) {
    system.push_back(g.Fresh(g.Uniform(p.api_system_min, p.api_system_max)));
    weight.push_back(1.0 / std::pow(i + 1.0, p.api_zipf_s));
  }
  std::discrete_distribution<std::size_t> pick(weight.begin(), weight.end());
  std::vector<Session> out;
  for (std::uint32_t r = 0; r < requests; ++r) {
    Turn t;
    t.prompt = system[pick(g.rng())];
    Append(t.prompt, g.Fresh(g.Uniform(p.api_user_min, p.api_user_max)));
    t.output = g.Fresh(g.Uniform(50, 300));  // never reused: the next request is a new user
    out.push_back(Session{Workload::kApi, 0, {std::move(t)}});
  }
  return out;
}

std::vector<Session> Coding(Gen& g, const WorkloadParams& p, std::uint32_t requests) {
  std::vector<Session> out;
  for (std::uint32_t r = 0; r < requests;) {
    Session s{Workload::kCoding, p.coding_think_s, {}};
    Tokens history = g.Fresh(g.Uniform(p.coding_context_min, p.coding_context_max));
    const std::uint32_t turns = g.Uniform(p.coding_turns_min, p.coding_turns_max);
    for (std::uint32_t k = 0; k < turns; ++k, ++r) {
      Turn t;
      Append(history, g.Fresh(g.Uniform(p.coding_user_min, p.coding_user_max)));
      t.prompt = history;
      t.output = g.Fresh(g.Uniform(p.coding_answer_min, p.coding_answer_max));
      Append(history, t.output);
      s.turns.push_back(std::move(t));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Session> Rag(Gen& g, const WorkloadParams& p, std::uint32_t requests) {
  const Tokens system = g.Fresh(p.rag_system_tokens);
  std::vector<Tokens> docs;
  std::vector<Session> out;
  for (std::uint32_t r = 0; r < requests;) {
    Session s{Workload::kRag, p.rag_think_s, {}};
    Tokens history = system;
    if (!docs.empty() && g.Unit() < p.rag_doc_revisit) {
      Append(history, docs[g.Uniform(0, static_cast<std::uint32_t>(docs.size() - 1))]);
    } else {
      docs.push_back(g.Fresh(g.Uniform(p.rag_doc_min, p.rag_doc_max)));
      Append(history, docs.back());
    }
    const std::uint32_t turns = g.Uniform(p.rag_turns_min, p.rag_turns_max);
    for (std::uint32_t k = 0; k < turns; ++k, ++r) {
      Turn t;
      Append(history, g.Fresh(g.Uniform(p.rag_question_min, p.rag_question_max)));
      t.prompt = history;
      t.output = g.Fresh(g.Uniform(p.rag_answer_min, p.rag_answer_max));
      Append(history, t.output);
      s.turns.push_back(std::move(t));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Session> OneShot(Gen& g, const WorkloadParams& p, std::uint32_t requests) {
  std::vector<Session> out;
  for (std::uint32_t r = 0; r < requests; ++r) {
    Turn t{g.Fresh(g.Uniform(p.oneshot_min, p.oneshot_max)), g.Fresh(g.Uniform(100, 400))};
    out.push_back(Session{Workload::kOneShot, 0, {std::move(t)}});
  }
  return out;
}

// Places sessions on a timeline whose offered load is `load`: Poisson session starts at the
// rate that gives load × prefill_tokens_per_s prompt tokens per second, turns after think
// times.
void Schedule(Gen& g, std::vector<Session>& sessions, double load, double prefill_tokens_per_s,
              std::vector<Request>* out) {
  std::uint64_t tokens = 0, requests = 0;
  for (const Session& s : sessions) {
    for (const Turn& t : s.turns) tokens += t.prompt.size(), ++requests;
  }
  if (requests == 0) return;
  const double mean_tokens = static_cast<double>(tokens) / static_cast<double>(requests);
  const double request_rate = load * prefill_tokens_per_s / mean_tokens;
  const double session_rate =
      request_rate * static_cast<double>(sessions.size()) / static_cast<double>(requests);
  double start = 0;
  for (Session& s : sessions) {
    start += g.Exp(1.0 / session_rate);
    double at = start;
    const coherence::Namespace ns =
        coherence::MakeNamespace(WorkloadName(s.workload), "replay-model", "replay-layout");
    for (std::size_t k = 0; k < s.turns.size(); ++k) {
      if (k > 0) at += g.Exp(s.think_s);
      Request r;
      r.arrival_s = at;
      r.workload = s.workload;
      r.ns = ns;
      r.prompt = std::move(s.turns[k].prompt);
      r.output = std::move(s.turns[k].output);
      out->push_back(std::move(r));
    }
  }
}

bool RangesOk(const WorkloadParams& p) {
  return p.api_system_prompts > 0 && p.api_system_min <= p.api_system_max &&
         p.api_user_min <= p.api_user_max && p.coding_context_min <= p.coding_context_max &&
         p.coding_turns_min >= 1 && p.coding_turns_min <= p.coding_turns_max &&
         p.coding_user_min <= p.coding_user_max && p.coding_answer_min <= p.coding_answer_max &&
         p.rag_doc_min <= p.rag_doc_max && p.rag_turns_min >= 1 &&
         p.rag_turns_min <= p.rag_turns_max && p.rag_question_min <= p.rag_question_max &&
         p.rag_answer_min <= p.rag_answer_max && p.oneshot_min <= p.oneshot_max &&
         p.oneshot_min >= 16 && p.coding_think_s > 0 && p.rag_think_s > 0;
}

}  // namespace

absl::string_view WorkloadName(Workload w) noexcept {
  switch (w) {
    case Workload::kApi: return "api";
    case Workload::kCoding: return "coding";
    case Workload::kRag: return "rag";
    case Workload::kOneShot: return "oneshot";
  }
  return "?";
}

absl::StatusOr<Workload> ParseWorkload(absl::string_view name) {
  for (int i = 0; i < kWorkloadCount; ++i) {
    if (WorkloadName(static_cast<Workload>(i)) == name) return static_cast<Workload>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("trace '", name, "': expected api, coding, rag, oneshot or mixed"));
}

HitBand DeclaredBand(Workload w) noexcept {
  switch (w) {
    case Workload::kApi: return {0.30, 0.50};
    case Workload::kCoding: return {0.85, 0.95};
    case Workload::kRag: return {0.80, 0.90};
    case Workload::kOneShot: return {0.0, 0.0};
  }
  return {};
}

absl::StatusOr<Trace> GenerateTrace(const TraceSpec& spec) {
  if (!RangesOk(spec.params)) return absl::InvalidArgumentError("trace: an empty token range");
  if (!(spec.load > 0) || !(spec.prefill_tokens_per_s > 0) || spec.requests == 0) {
    return absl::InvalidArgumentError("trace: load, prefill rate and requests must be > 0");
  }
  Gen g(spec.seed);
  std::vector<Request> requests;
  auto one = [&](Workload w, std::uint32_t n, double load) {
    std::vector<Session> s;
    switch (w) {
      case Workload::kApi: s = Api(g, spec.params, n); break;
      case Workload::kCoding: s = Coding(g, spec.params, n); break;
      case Workload::kRag: s = Rag(g, spec.params, n); break;
      case Workload::kOneShot: s = OneShot(g, spec.params, n); break;
    }
    Schedule(g, s, load, spec.prefill_tokens_per_s, &requests);
  };
  if (spec.name == "mixed") {
    double total = 0;
    for (double m : spec.mix) total += m;
    if (!(total > 0)) return absl::InvalidArgumentError("trace mixed: the mix sums to 0");
    // Each workload brings its share of the requests and of the offered load.
    for (int i = 0; i < kWorkloadCount; ++i) {
      const double share = spec.mix[i] / total;
      const auto n = static_cast<std::uint32_t>(std::lround(share * spec.requests));
      if (n > 0) one(static_cast<Workload>(i), n, spec.load * share);
    }
  } else {
    auto w = ParseWorkload(spec.name);
    if (!w.ok()) return w.status();
    one(*w, spec.requests, spec.load);
  }
  std::stable_sort(requests.begin(), requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  Trace t;
  t.name = spec.name;
  t.seed = spec.seed;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].id = i;
    t.prompt_tokens += requests[i].prompt.size();
  }
  t.duration_s = requests.empty() ? 0 : requests.back().arrival_s;
  t.request_rate_per_s =
      t.duration_s > 0 ? static_cast<double>(requests.size()) / t.duration_s : 0;
  t.requests = std::move(requests);
  return t;
}

}  // namespace cxlkv::replay
