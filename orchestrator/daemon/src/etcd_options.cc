// The etcd client's options from the [etcd] section (etcd_options.h).
#include "etcd_options.h"

namespace cxlkv::orchestrator {

etcd::ClientOptions EtcdClientOptions(const EtcdConfig& e) {
  etcd::ClientOptions o;
  o.endpoints = e.endpoints;
  o.call_timeout_ms = e.call_timeout_ms;
  o.user = e.user;
  o.password = e.password;
  o.ca_pem = e.ca_pem;
  o.cert_pem = e.cert_pem;
  o.key_pem = e.key_pem;
  return o;
}

}  // namespace cxlkv::orchestrator
