#include "cxlkv/orchestrator/directory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/crc32c.h"

namespace cxlkv::orchestrator::directory {

namespace {

constexpr std::uint32_t kMagic = 0x53445843;  // "CXDS" little-endian
constexpr std::uint16_t kVersion = 1;
// Version 2: the same with the publish key's id (8 bytes) after built_unix_ms: a summary whose
// keys were keyed with that secret (published_key.h). Unkeyed summaries stay version 1.
constexpr std::uint16_t kVersionKeyed = 2;

// A 64-bit finalizer (splitmix64's): chain keys are already hash output, but anchor choice
// and filter positions must not read the same raw bits.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the tree builds for little-endian x86-64 / aarch64 only
  out->append(b, sizeof(T));
}

class Reader {
 public:
  explicit Reader(absl::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(std::size_t n, absl::string_view* out) {
    if (b_.size() - pos_ < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  std::size_t pos() const { return pos_; }

 private:
  absl::string_view b_;
  std::size_t pos_ = 0;
};

}  // namespace

FilterSize SizeFor(std::uint64_t expected_keys, double fp_rate) {
  const double n = static_cast<double>(std::max<std::uint64_t>(expected_keys, 1));
  const double p = std::clamp(fp_rate, 1e-9, 0.5);
  const double ln2 = std::log(2.0);
  double m = std::ceil(-n * std::log(p) / (ln2 * ln2));
  m = std::min(m, static_cast<double>(kMaxFilterBytes * 8));
  FilterSize s;
  s.bits = std::max<std::uint64_t>(64, (static_cast<std::uint64_t>(m) + 63) / 64 * 64);
  const double k = std::round(static_cast<double>(s.bits) / n * ln2);
  s.hashes = static_cast<std::uint32_t>(std::clamp(k, 1.0, 30.0));
  return s;
}

FilterSize SizeForBytes(std::uint64_t bytes, std::uint64_t expected_keys) {
  FilterSize s;
  s.bits = std::max<std::uint64_t>(64, std::min(bytes, kMaxFilterBytes) * 8 / 64 * 64);
  const double n = static_cast<double>(std::max<std::uint64_t>(expected_keys, 1));
  const double k = std::round(static_cast<double>(s.bits) / n * std::log(2.0));
  s.hashes = static_cast<std::uint32_t>(std::clamp(k, 1.0, 30.0));
  return s;
}

double FalsePositiveRate(const FilterSize& size, std::uint64_t keys) {
  if (size.bits == 0) return 1.0;
  const double k = size.hashes;
  return std::pow(1.0 - std::exp(-k * static_cast<double>(keys) / static_cast<double>(size.bits)),
                  k);
}

bool IsAnchor(const coherence::PrefixKey& key, std::uint32_t anchor_every) {
  if (anchor_every <= 1) return true;
  return Mix(key.lo ^ Mix(key.hi)) % anchor_every == 0;
}

BloomFilter::BloomFilter(const FilterSize& size)
    : bits_(size.bits / 64 * 64), hashes_(size.hashes), words_(size.bits / 64, 0) {}

BloomFilter BloomFilter::FromWords(std::uint32_t hashes, std::vector<std::uint64_t> words) {
  BloomFilter f;
  f.bits_ = words.size() * 64;
  f.hashes_ = hashes;
  f.words_ = std::move(words);
  return f;
}

// Double hashing (Kirsch and Mitzenmacher): position i = h1 + i * h2 mod m.
void BloomFilter::Add(const coherence::PrefixKey& key) {
  if (bits_ == 0) return;
  const std::uint64_t h1 = Mix(key.lo), h2 = Mix(key.hi) | 1;
  for (std::uint32_t i = 0; i < hashes_; ++i) {
    const std::uint64_t bit = (h1 + i * h2) % bits_;
    words_[bit / 64] |= 1ull << (bit % 64);
  }
}

bool BloomFilter::MayContain(const coherence::PrefixKey& key) const {
  if (bits_ == 0) return false;
  const std::uint64_t h1 = Mix(key.lo), h2 = Mix(key.hi) | 1;
  for (std::uint32_t i = 0; i < hashes_; ++i) {
    const std::uint64_t bit = (h1 + i * h2) % bits_;
    if ((words_[bit / 64] & (1ull << (bit % 64))) == 0) return false;
  }
  return true;
}

std::string EncodeSummary(const Summary& s) {
  std::string out;
  out.reserve(64 + s.domain.size() + s.filter.bytes());
  Put<std::uint32_t>(&out, kMagic);
  Put<std::uint16_t>(&out, s.keyed ? kVersionKeyed : kVersion);
  Put<std::uint16_t>(&out, static_cast<std::uint16_t>(s.filter.size().hashes));
  Put<std::uint32_t>(&out, s.anchor_every);
  Put<std::uint32_t>(&out, static_cast<std::uint32_t>(s.filter.words().size()));
  Put<std::int64_t>(&out, s.epoch);
  Put<std::uint64_t>(&out, s.published);
  Put<std::uint64_t>(&out, s.anchors);
  Put<std::int64_t>(&out, s.built_unix_ms);
  if (s.keyed) Put<std::uint64_t>(&out, s.key_id);
  Put<std::uint16_t>(&out, static_cast<std::uint16_t>(s.domain.size()));
  out.append(s.domain);
  for (std::uint64_t w : s.filter.words()) Put<std::uint64_t>(&out, w);
  Put<std::uint32_t>(&out, coherence::Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<Summary> DecodeSummary(absl::string_view bytes) {
  auto bad = [&](const char* what) {
    return absl::DataLossError(absl::StrCat("directory summary (", bytes.size(), " bytes): ", what,
                                            "; its domain's leader rewrites it within "
                                            "directory.refresh_ms"));
  };
  if (bytes.size() < 4 + 4) return bad("too short");
  std::uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (coherence::Crc32c(bytes.data(), bytes.size() - 4) != crc) return bad("CRC32C mismatch");
  Reader r(bytes.substr(0, bytes.size() - 4));
  std::uint32_t magic = 0, words = 0;
  std::uint16_t version = 0, hashes = 0, name_len = 0;
  Summary s;
  if (!r.Get(&magic) || magic != kMagic) return bad("not a summary (magic)");
  if (!r.Get(&version) || (version != kVersion && version != kVersionKeyed)) {
    return bad("unknown version");
  }
  s.keyed = version == kVersionKeyed;
  if (!r.Get(&hashes) || !r.Get(&s.anchor_every) || !r.Get(&words) || !r.Get(&s.epoch) ||
      !r.Get(&s.published) || !r.Get(&s.anchors) || !r.Get(&s.built_unix_ms) ||
      (s.keyed && !r.Get(&s.key_id)) || !r.Get(&name_len)) {
    return bad("torn header");
  }
  absl::string_view name, body;
  if (!r.Bytes(name_len, &name)) return bad("torn domain name");
  if (!r.Bytes(std::size_t{words} * 8, &body) || r.pos() != bytes.size() - 4) {
    return bad("filter length does not match");
  }
  if (hashes == 0 || hashes > 30) return bad("hash count out of range");
  s.domain = std::string(name);
  std::vector<std::uint64_t> w(words);
  if (words != 0) std::memcpy(w.data(), body.data(), body.size());
  s.filter = BloomFilter::FromWords(hashes, std::move(w));
  return s;
}

DomainAnswer AnswerFor(const Summary& s, const coherence::PrefixKey& key,
                       const std::vector<PublishedKeyer>& keyers, std::int64_t now_unix_ms) {
  DomainAnswer a;
  a.domain = s.domain;
  a.keyed = s.keyed;
  coherence::PrefixKey asked = key;
  if (s.keyed) {
    a.key_held = false;
    for (const PublishedKeyer& k : keyers) {
      if (k.id() == s.key_id) {
        asked = k.Apply(key);
        a.key_held = true;
        break;
      }
    }
  }
  a.anchor = IsAnchor(asked, s.anchor_every);
  a.may_hold = a.key_held && a.anchor && s.filter.MayContain(asked);
  a.published = s.published;
  a.fp_rate = FalsePositiveRate(s.filter.size(), s.anchors);
  a.epoch = s.epoch;
  a.age_ms = now_unix_ms - s.built_unix_ms;
  a.filter_bytes = s.filter.bytes();
  return a;
}

std::string DirectoryPrefix(const std::string& cluster) {
  return absl::StrCat("/cxlkv/v1/", cluster, "/directory/");
}

std::string SummaryKey(const std::string& cluster, const std::string& domain) {
  return DirectoryPrefix(cluster) + domain;
}

}  // namespace cxlkv::orchestrator::directory
