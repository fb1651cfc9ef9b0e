// [lmcache] of domain.toml, and the tenants' token file.
#include "cxlkv/orchestrator/lmcache/config.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cxlkv/base/toml_reader.h"

namespace cxlkv::coordinator {
namespace {

bool ValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > 64) return false;
  for (char ch : t) {
    if (std::isalnum(static_cast<unsigned char>(ch)) == 0 && ch != '_' && ch != '.' && ch != '-') {
      return false;
    }
  }
  return true;
}

// Printable ASCII without spaces, at most 4096 characters (the length's floor is a setting).
bool ValidToken(absl::string_view t) {
  if (t.empty() || t.size() > 4096) return false;
  for (char ch : t) {
    if (ch <= ' ' || ch > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<CoordinatorConfig> ParseCoordinatorConfig(absl::string_view text,
                                                         absl::string_view source_name) {
  absl::StatusOr<toml::table> parsed = base::ParseToml(text, source_name);
  if (!parsed.ok()) return parsed.status();
  CoordinatorConfig c;
  const toml::node* section = parsed->get("lmcache");
  if (section == nullptr) return c;
  const base::TomlReader p(source_name);
  using H = base::TomlReader::Handler;
  auto str = [&p](std::string* out) {
    return H([&p, out](const toml::node& v, const std::string& k) { return p.Str(v, k, out); });
  };
  auto u32 = [&p](std::uint32_t* out, std::int64_t lo, std::int64_t hi) {
    return H([&p, out, lo, hi](const toml::node& v, const std::string& k) {
      return p.U32(v, k, out, lo, hi);
    });
  };
  auto size = [&p](std::uint64_t* out) {
    return H([&p, out](const toml::node& v, const std::string& k) { return p.Size(v, k, out); });
  };
  // clang-format off
  absl::Status st = p.Table(*section, "lmcache", {
    {"listen", str(&c.listen)},
    {"token_file", str(&c.token_file)},
    {"token_file_readable", H([&p, &c](const toml::node& v, const std::string& k) {
       return p.Bool(v, k, &c.token_file_readable);
     })},
    {"token_min_length", u32(&c.token_min_length, 1, 4096)},
    {"region_id", str(&c.region_id)},
    {"layout_id", str(&c.layout_id)},
    {"region_size", size(&c.region_bytes)},
    {"alignment", size(&c.alignment_bytes)},
    {"reservation_ttl_ms", u32(&c.reservation_ttl_ms, 10, 86400000)},
    {"read_lease_ms", u32(&c.read_lease_ms, 0, 86400000)},
    {"index", H([&p, &c](const toml::node& v, const std::string& k) {
       return p.Bool(v, k, &c.index);
     })},
    {"index_wait_ms", u32(&c.index_wait_ms, 0, 600000)},
    {"evict_ahead", H([&p, &c](const toml::node& v, const std::string& k) {
       // 0: evict only what each batch needs (every reserve of a full region then waits for
       // the index's grace); otherwise a size.
       if (v.is_integer() && *v.value<std::int64_t>() == 0) {
         c.evict_ahead_bytes = 0;
         return absl::OkStatus();
       }
       return p.Size(v, k, &c.evict_ahead_bytes);
     })},
    {"max_batch", u32(&c.max_batch, 0, 1 << 20)},
    {"threads", u32(&c.threads, 1, 256)},
    {"state_file", str(&c.state_file)},
    {"quotas", H([&](const toml::node& n, const std::string& k) {
       const toml::table* t = n.as_table();
       if (t == nullptr) return p.Error(n, k, "expected a table of tenant = size");
       for (auto&& [tkey, v] : *t) {
         const std::string tenant(tkey.str());
         const std::string full = absl::StrCat(k, ".", tenant);
         if (!ValidTenant(tenant)) {
           return p.Error(v, full, "a tenant is 1-64 characters of [A-Za-z0-9_.-]");
         }
         std::uint64_t bytes = 0;
         if (auto s = p.Size(v, full, &bytes); !s.ok()) return s;
         c.quotas[tenant] = bytes;
       }
       return absl::OkStatus();
     })},
  });
  // clang-format on
  if (!st.ok()) return st;
  auto missing = [&](absl::string_view key, absl::string_view example) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": key 'lmcache.", key,
                                                   "' is required with [lmcache] (for example ",
                                                   example, ")"));
  };
  if (c.listen.empty()) return missing("listen", "listen = \"127.0.0.1:9400\"");
  if (c.listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": key 'lmcache.listen': '",
                                                   c.listen,
                                                   "' is not HOST:PORT (\"127.0.0.1:9400\")"));
  }
  if (c.token_file.empty())
    return missing("token_file", "token_file = \"/etc/cxlkv/lmcache.tokens\"");
  if (c.layout_id.empty()) return missing("layout_id", "layout_id = \"llama3-70b-fp16-tp1\"");
  if (c.region_bytes == 0) return missing("region_size", "region_size = \"8G\"");
  if (c.alignment_bytes < 64 || (c.alignment_bytes & (c.alignment_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": key 'lmcache.alignment': ", c.alignment_bytes,
                     " is not a power of two of at least 64 (LMCache's default is \"2M\")"));
  }
  return c;
}

absl::Status ResolveCoordinatorConfig(CoordinatorConfig* c, const std::string& domain_name,
                                      const std::string& domain_state_file,
                                      std::uint64_t extent_bytes) {
  if (!c->enabled()) return absl::OkStatus();
  if (c->alignment_bytes > extent_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("lmcache.alignment: ", c->alignment_bytes,
                                                   " is larger than domain.extent_size (",
                                                   extent_bytes, ")"));
  }
  if (c->evict_ahead_bytes == CoordinatorConfig::kEvictAheadDefault) {
    c->evict_ahead_bytes = c->region_bytes / 64;
  }
  if (c->evict_ahead_bytes > c->region_bytes / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lmcache.evict_ahead: ", c->evict_ahead_bytes, " bytes is more than half the region (",
        c->region_bytes, "): eviction ahead of need would empty it; the default is a 64th"));
  }
  if (c->region_id.empty()) c->region_id = domain_name;
  if (c->state_file.empty()) c->state_file = domain_state_file + ".lmcache";
  return absl::OkStatus();
}

std::uint64_t HostPoolBytes(const CoordinatorConfig& c, std::uint64_t pool_bytes,
                            std::uint64_t extent_bytes) {
  if (!c.enabled()) return pool_bytes;
  const std::uint64_t whole = pool_bytes / extent_bytes * extent_bytes;
  // The region's extents, the last one partly used when region_bytes is not whole extents:
  // no host is lent an extent the coordinator's objects are in.
  const std::uint64_t lent = (c.region_bytes + extent_bytes - 1) / extent_bytes * extent_bytes;
  return whole > lent ? whole - lent : 0;
}

absl::StatusOr<std::map<std::string, std::string>> LoadTenantTokens(const std::string& path,
                                                                    const TokenFileRules& rules,
                                                                    std::string* warning) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) {
    return absl::NotFoundError(absl::StrCat("lmcache.token_file ", path,
                                            ": cannot be read (create it, mode 600: one token, or "
                                            "lines \"TENANT TOKEN\")"));
  }
  if ((sb.st_mode & 077) != 0) {
    const std::string mode = absl::StrFormat("%04o", sb.st_mode & 0777);
    if (!rules.accept_readable) {
      return absl::PermissionDeniedError(absl::StrCat(
          "lmcache.token_file ", path, ": group or others may read it (mode ", mode,
          "), and a token is a tenant's whole credential: `chmod 600 ", path,
          "`, or set lmcache.token_file_readable = true to accept it as LMCache does"));
    }
    if (warning != nullptr) {
      *warning = absl::StrCat("lmcache.token_file ", path, " has mode ", mode,
                              ": group or others may read the tokens (accepted: "
                              "lmcache.token_file_readable = true); `chmod 600 ",
                              path, "` keeps them the owner's");
    }
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("lmcache.token_file ", path, ": cannot open"));
  std::map<std::string, std::string> tokens;
  std::string line;
  int n = 0;
  std::vector<std::string> bare;
  while (std::getline(in, line)) {
    ++n;
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l.front() == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(l, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("lmcache.token_file ", path, ":", n, ": ", what,
                       " (one bare token, or lines \"TENANT TOKEN\")"));
    };
    std::string tenant = "default", token;
    if (f.size() == 1) {
      token = std::string(f[0]);
      bare.push_back(token);
    } else if (f.size() == 2) {
      tenant = std::string(f[0]);
      token = std::string(f[1]);
      if (!ValidTenant(tenant)) return bad("a tenant is 1-64 characters of [A-Za-z0-9_.-]");
    } else {
      return bad("expected TENANT TOKEN");
    }
    if (!ValidToken(token)) {
      return bad("a token is printable ASCII characters without spaces, at most 4096");
    }
    if (token.size() < rules.min_length) {
      return bad(absl::StrCat("a token of ", token.size(), " characters is shorter than ",
                              rules.min_length,
                              " (a token is a tenant's whole credential): "
                              "use a longer one, or set lmcache.token_min_length = ",
                              token.size(), " to accept it as LMCache does"));
    }
    if (!tokens.emplace(token, tenant).second) return bad("this token is already listed");
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lmcache.token_file ", path, ": no token (one bare token, or lines \"TENANT TOKEN\")"));
  }
  if (!bare.empty() && tokens.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lmcache.token_file ", path,
                     ": a bare token is only allowed alone; name its tenant (\"default TOKEN\")"));
  }
  return tokens;
}

}  // namespace cxlkv::coordinator
