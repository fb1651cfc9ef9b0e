// cxlkv/orchestrator/token.h — what both ends of the control plane share: the secret that
// authorizes TCP calls, the leader record's seal, the mark of an orchestrator's answer.
#ifndef CXLKV_ORCHESTRATOR_TOKEN_H_
#define CXLKV_ORCHESTRATOR_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::orchestrator {

// A token from a file: trimmed, 16 to 4096 printable characters, and the file readable by its
// owner only (like ssh keys). `what` names the setting in errors.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what);

// Whether `presented` (an "authorization" header value) is "Bearer <token>"; constant time in
// the token's contents.
bool TokenMatches(absl::string_view presented, absl::string_view token);

// The leader record's seal (docs/ha.md "Hosts following the leader"): HMAC-SHA256 with the
// domain's token over the leader key's name, a newline and the record (a JSON object without
// its "mac" field, as nlohmann::json dumps it: keys sorted), in lowercase hex.
std::string LeaderRecordMac(absl::string_view token, absl::string_view key,
                            absl::string_view record);

// The trailing metadata key every answer of the daemon's Orchestrator service carries (value
// "1"), errors included. A call that fails without it was answered by no orchestrator (the
// connection refused or closed first: a uid not in rpc.allowed_uids, nothing listening); one
// that fails with it carries the orchestrator's own reason, which the host passes on as it is.
inline constexpr char kAnsweredByOrchestrator[] = "cxlkv-orchestrator-answered";

// A small file's contents; errors name `what` and the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_TOKEN_H_
