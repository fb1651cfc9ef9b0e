// The control plane's TCP token.
#include "cxlkv/orchestrator/token.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cxlkv/base/errno.h"

namespace cxlkv::orchestrator {

using base::ErrnoText;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::NotFoundError(
        absl::StrCat(what, " '", path, "': cannot read: ", ErrnoText(errno)));
  }
  // Bounded: certificates and tokens are small, and a path may name a device or /proc file.
  std::string out(1 << 20, '\0');
  f.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<std::size_t>(f.gcount()));
  if (!f.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': larger than 1 MiB"));
  }
  return out;
}

std::string LeaderRecordMac(absl::string_view token, absl::string_view key,
                            absl::string_view record) {
  const std::string msg = absl::StrCat(key, "\n", record);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", mac[i]);
  return hex;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(what, " '", path, "': ", ErrnoText(errno),
                                            "; create it with e.g. `head -c 32 /dev/urandom | "
                                            "base64 > FILE && chmod 600 FILE`"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " '", path, "': readable or writable by group or others (mode ",
                     absl::StrFormat("%o", st.st_mode & 0777), "); `chmod 600 ", path, "`"));
  }
  auto text = ReadSmallFile(path, what);
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.size() < 16 || token.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "': the token must be 16 to 4096 characters (it has ",
                     token.size(), "); e.g. `head -c 32 /dev/urandom | base64`"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", path, "': the token must be printable ASCII without spaces"));
    }
  }
  return token;
}

bool TokenMatches(absl::string_view presented, absl::string_view token) {
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(presented, kBearer)) return false;
  presented.remove_prefix(kBearer.size());
  // Constant time in the token's contents (the length is not secret).
  unsigned char diff = presented.size() == token.size() ? 0 : 1;
  for (std::size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(token[i] ^ (i < presented.size() ? presented[i] : 0));
  }
  return diff == 0;
}

}  // namespace cxlkv::orchestrator
