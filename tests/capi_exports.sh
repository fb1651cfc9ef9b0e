#!/usr/bin/env bash
# libcxlkv.so exports exactly the functions include/cxlkv/cxlkv.h declares: every declared
# function is defined and exported (a binding such as ctypes finds it), and nothing else is
# (the C++ modules linked into the library stay private: capi/src/exports.map).
# Usage: capi_exports.sh <libcxlkv.so> <cxlkv.h>
set -euo pipefail
lib=$1 header=$2
# Declarations start at the beginning of a line with their return type; comments, typedefs
# and preprocessor lines do not.
declared=$(grep -E '^[A-Za-z]' "$header" | grep -vE '^(typedef|#|extern|enum|struct)' |
           grep -oE '\bcxlkv_[a-z0-9_]+\(' | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwVvDdBbRr]$/ {print $3}' | sed 's/@.*//' |
           sort -u)
[[ -n $declared ]] || { echo "capi_exports: no declarations found in $header" >&2; exit 1; }
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
status=0
if [[ -n $missing ]]; then
  echo "capi_exports: declared in $header but not exported by $lib (define them with CXLKV_API):" >&2
  echo "$missing" | sed 's/^/  /' >&2
  status=1
fi
if [[ -n $extra ]]; then
  echo "capi_exports: exported by $lib but not declared in $header (declare them, or keep them" \
       "out of capi/src/exports.map's cxlkv_* pattern):" >&2
  echo "$extra" | sed 's/^/  /' >&2
  status=1
fi
[[ $status -ne 0 ]] || echo "capi_exports: $(echo "$declared" | wc -l) functions, all exported, nothing else"
exit $status
