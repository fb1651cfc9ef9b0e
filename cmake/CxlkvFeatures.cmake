# Optional features, one way: every CXLKV_WITH_<NAME> is AUTO (build it when its dependencies
# are here, else say why and skip it), ON (fail configuration without them) or OFF (never).
#   cxlkv_feature(NAME "what it is")        declares and checks the cache variable
#   cxlkv_feature_enabled(NAME out_var)     TRUE unless OFF (prints the OFF status line)
#   cxlkv_feature_missing(NAME "why, and the fix")
#                                           the dependencies are missing: FATAL_ERROR under ON,
#                                           else a status line saying what is skipped
# Features: MEMKIND (CMakeLists.txt), CUDA (CxlkvCuda.cmake), ETCD (orchestrator/etcd),
# KV_EVENTS (orchestrator/events).
function(cxlkv_feature name doc)
  set(var CXLKV_WITH_${name})
  set(${var} "AUTO" CACHE STRING "${doc}: AUTO, ON, OFF")
  set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ${var} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${var} must be AUTO, ON or OFF, got '${${var}}'")
  endif()
endfunction()

function(cxlkv_feature_enabled name out)
  if(CXLKV_WITH_${name} STREQUAL "OFF")
    message(STATUS "cxlkv: CXLKV_WITH_${name}=OFF: not built")
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

function(cxlkv_feature_missing name why)
  string(CONCAT why "${why}" ${ARGN})  # long messages may come in several strings
  if(CXLKV_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "CXLKV_WITH_${name}=ON but ${why}")
  endif()
  message(STATUS "cxlkv: ${why}: skipped (CXLKV_WITH_${name}=AUTO)")
endfunction()
