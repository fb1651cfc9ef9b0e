// bench/replay/trace.h — seeded synthetic request traces for the KV trace replay (issue #7).
//
// A trace is a list of requests in arrival order. Each request carries its prompt as token
// ids, so its prefix structure is real: two requests share KV blocks exactly when their
// first 16·k tokens are equal, and the replay finds that out through chained prefix keys
// (coherence::ChainKey), not from a label. Four workloads (docs/replay.md has the numbers):
//   api      a few shared system prompts (Zipf popularity) + a unique user message
//   coding   multi-turn sessions: each turn's prompt is the whole conversation so far
//            (repository context, earlier turns and the assistant's answers) + a new message
//   rag      document follow-ups: system prompt + a document + earlier Q/A + a new question;
//            most sessions open a new document, some return to one already asked about
//   oneshot  a unique long document each time: nothing is shared
// and "mixed", the four interleaved on one timeline.
//
// Arrivals: requests of api/oneshot, and the first turn of each session, arrive as a
// Poisson process; later turns of a session follow their predecessor after an exponential
// think time. The request rate is set from an offered load: load × prefill_tokens_per_s /
// mean prompt tokens (load 1 keeps a recompute-everything server exactly busy).
//
// Everything is a pure function of TraceSpec (seed included). Not thread-safe to share a
// TraceSpec being written; generated traces are plain values.
#ifndef CXLKV_BENCH_REPLAY_TRACE_H_
#define CXLKV_BENCH_REPLAY_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/coherence/prefix.h"

namespace cxlkv::replay {

enum class Workload : std::uint8_t { kApi = 0, kCoding, kRag, kOneShot };
inline constexpr int kWorkloadCount = 4;
absl::string_view WorkloadName(Workload w) noexcept;

struct Request {
  std::uint64_t id = 0;
  double arrival_s = 0;
  Workload workload = Workload::kApi;
  coherence::Namespace ns = 0;
  std::vector<std::uint32_t> prompt;  // token ids
  // Tokens the model answers with. Their KV is computed during decode and cached with the
  // prompt's, so the next turn of a conversation finds them.
  std::vector<std::uint32_t> output;
};

// Expected block hit rate of a workload with unbounded cache (the bands).
struct HitBand {
  double lo = 0;
  double hi = 1;
};
HitBand DeclaredBand(Workload w) noexcept;

// Shape of each workload, in tokens (uniform ranges [min, max]).
struct WorkloadParams {
  // api
  std::uint32_t api_system_prompts = 6;
  std::uint32_t api_system_min = 800, api_system_max = 1600;
  std::uint32_t api_user_min = 1000, api_user_max = 2600;
  double api_zipf_s = 1.0;
  // coding
  std::uint32_t coding_context_min = 1500, coding_context_max = 4000;
  std::uint32_t coding_turns_min = 6, coding_turns_max = 14;
  std::uint32_t coding_user_min = 40, coding_user_max = 300;
  std::uint32_t coding_answer_min = 80, coding_answer_max = 500;
  double coding_think_s = 30;
  // rag
  std::uint32_t rag_system_tokens = 400;
  std::uint32_t rag_doc_min = 3000, rag_doc_max = 7000;
  std::uint32_t rag_turns_min = 3, rag_turns_max = 8;
  std::uint32_t rag_question_min = 20, rag_question_max = 120;
  std::uint32_t rag_answer_min = 100, rag_answer_max = 400;
  double rag_doc_revisit = 0.2;  // chance a session opens a document asked about before
  double rag_think_s = 20;
  // oneshot
  std::uint32_t oneshot_min = 6000, oneshot_max = 16000;
};

struct TraceSpec {
  std::string name;                    // "api", "coding", "rag", "oneshot" or "mixed"
  std::uint32_t requests = 400;        // about: sessions are kept whole
  double load = 0.7;                   // offered load relative to prefill throughput
  double prefill_tokens_per_s = 10000;
  std::uint64_t seed = 1;
  // Share of the mixed trace's requests per workload (api, coding, rag, oneshot).
  double mix[kWorkloadCount] = {0.4, 0.25, 0.2, 0.15};
  WorkloadParams params;
};

struct Trace {
  std::string name;
  std::vector<Request> requests;  // by arrival
  double duration_s = 0;          // last arrival
  double request_rate_per_s = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t seed = 0;
};

// kInvalidArgument for an unknown name or empty ranges.
absl::StatusOr<Trace> GenerateTrace(const TraceSpec& spec);
absl::StatusOr<Workload> ParseWorkload(absl::string_view name);

}  // namespace cxlkv::replay

#endif  // CXLKV_BENCH_REPLAY_TRACE_H_
