#include "cxlkv/orchestrator/published_key.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace cxlkv::orchestrator {

namespace {

constexpr char kKeyLabel[] = "cxlkv published key v1";  // the NUL travels too
constexpr char kIdLabel[] = "cxlkv key id v1";

void PutBe64(std::uint64_t v, unsigned char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(v);
    v >>= 8;
  }
}
std::uint64_t GetBe64(const unsigned char* in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | in[i];
  return v;
}

// HMAC-SHA256 of `msg`; false when libcrypto refuses.
bool Mac(const std::string& secret, const unsigned char* msg, std::size_t len,
         std::array<unsigned char, 32>* out) {
  unsigned int n = 0;
  return HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, len, out->data(),
              &n) != nullptr &&
         n == out->size();
}

}  // namespace

absl::StatusOr<PublishedKeyer> PublishedKeyer::Create(const std::string& secret) {
  if (secret.size() < kMinPublishSecret) {
    return absl::InvalidArgumentError(
        absl::StrCat("a publish secret must have at least ", kMinPublishSecret, " bytes (it has ",
                     secret.size(), "); make one with `head -c 32 /dev/urandom | base64 > FILE`"));
  }
  PublishedKeyer k(secret);
  std::array<unsigned char, 32> mac{};
  if (!Mac(k.secret_, reinterpret_cast<const unsigned char*>(kIdLabel), sizeof kIdLabel, &mac)) {
    char err[256] = "unknown";
    ERR_error_string_n(ERR_get_error(), err, sizeof err);
    return absl::InternalError(absl::StrCat("libcrypto refused HMAC-SHA256: ", err));
  }
  k.id_ = GetBe64(mac.data());
  return k;
}

coherence::PrefixKey PublishedKeyer::Apply(const coherence::PrefixKey& key) const {
  std::array<unsigned char, sizeof kKeyLabel + 16> msg{};
  std::memcpy(msg.data(), kKeyLabel, sizeof kKeyLabel);
  PutBe64(key.hi, msg.data() + sizeof kKeyLabel);
  PutBe64(key.lo, msg.data() + sizeof kKeyLabel + 8);
  std::array<unsigned char, 32> mac{};
  // Create ran the same call with this secret, so libcrypto does not refuse it here.
  (void)Mac(secret_, msg.data(), msg.size(), &mac);
  return coherence::PrefixKey{GetBe64(mac.data() + 8), GetBe64(mac.data())};
}

}  // namespace cxlkv::orchestrator
