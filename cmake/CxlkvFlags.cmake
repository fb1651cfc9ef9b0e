# Target-scoped flags: every cxlkv target links cxlkv_flags.
add_library(cxlkv_flags INTERFACE)
target_compile_options(cxlkv_flags INTERFACE
  -Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion
  $<$<BOOL:${CXLKV_WERROR}>:-Werror>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  target_compile_options(cxlkv_flags INTERFACE -Wthread-safety)
endif()

if(CXLKV_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(CXLKV_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT CXLKV_SANITIZE STREQUAL "")
  message(FATAL_ERROR "CXLKV_SANITIZE must be '', 'address' or 'thread', got '${CXLKV_SANITIZE}'")
endif()

# Shared objects that must resolve every symbol at link time (the ABI-only .so files) link with
# ${CXLKV_LINK_NO_UNDEFINED}. clang leaves a sanitizer's runtime to the executable that loads
# the object (gcc links libasan.so into it), so in clang sanitizer builds the check is off.
set(CXLKV_LINK_NO_UNDEFINED "-Wl,--no-undefined")
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND NOT CXLKV_SANITIZE STREQUAL "")
  set(CXLKV_LINK_NO_UNDEFINED "")
  # A C program linking libcxlkv.so (C++ inside) needs the C++ half of clang's UBSan runtime
  # (vptr checks) and the C++ library it calls, which the C driver leaves out.
  add_link_options("$<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime;-lstdc++>")
endif()

# Fuzz builds instrument every library for coverage, so libFuzzer is guided into the parsers
# (the fuzz targets themselves add -fsanitize=fuzzer for the driver).
if(CXLKV_BUILD_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
