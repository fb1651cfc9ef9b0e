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

# clang links ASan's runtime statically into each executable by default, and an executable's
# own malloc then wins over an LD_PRELOADed one: the preload shim's tests under ASan would test
# ASan's allocator instead of the shim. Link the shared runtime instead, as GCC does (libasan.so):
# the shim, preloaded, comes first; shared objects record the runtime they need.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CXLKV_SANITIZE STREQUAL "address")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.asan-x86_64.so
                  OUTPUT_VARIABLE cxlkv_asan_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(cxlkv_asan_runtime_dir "${cxlkv_asan_runtime}" DIRECTORY)
  add_link_options(-shared-libasan "-Wl,-rpath,${cxlkv_asan_runtime_dir}")
endif()

# Shared objects that must resolve every symbol at link time (the ABI-only .so files) link with
# ${CXLKV_LINK_NO_UNDEFINED}. clang's TSan runtime is linked into executables only, so a shared
# object of a clang TSan build leaves its __tsan_* calls to the program that loads it.
set(CXLKV_LINK_NO_UNDEFINED "-Wl,--no-undefined")
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CXLKV_SANITIZE STREQUAL "thread")
  set(CXLKV_LINK_NO_UNDEFINED "")
endif()

# Fuzz builds instrument every library for coverage, so libFuzzer is guided into the parsers
# (the fuzz targets themselves add -fsanitize=fuzzer for the driver).
if(CXLKV_BUILD_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# The linker. GNU ld spends about three quarters of a link of the larger test programs that
# lld does not (a gRPC/etcd test program: 1.7 s against 0.45 s), and a check links about 450
# programs and libraries, the mutation stage relinks one for each mutant. `auto` links with lld
# where the compiler accepts -fuse-ld=lld (Debian: the lld package), else with the toolchain's
# default; `lld` insists; `default` keeps the toolchain's linker. C and C++ links only: a
# program nvcc links keeps nvcc's choice. A target that links with --wrap and counts on GNU ld's
# meaning of it adds ${CXLKV_LINK_WITH_GNU_LD} (see tests/CMakeLists.txt: lld also redirects
# the calls an object makes to a function it defines itself, GNU ld only those from others).
set(CXLKV_LINKER "auto" CACHE STRING "Linker: auto (lld when available), lld, default")
set_property(CACHE CXLKV_LINKER PROPERTY STRINGS auto lld default)
if(CXLKV_LINKER STREQUAL "auto" OR CXLKV_LINKER STREQUAL "lld")
  include(CheckLinkerFlag)
  check_linker_flag(CXX "-fuse-ld=lld" CXLKV_HAVE_LLD)
  if(CXLKV_HAVE_LLD)
    add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=lld>")
    set(CXLKV_LINK_WITH_GNU_LD "-fuse-ld=bfd")
  elseif(CXLKV_LINKER STREQUAL "lld")
    message(FATAL_ERROR "CXLKV_LINKER=lld, but ${CMAKE_CXX_COMPILER} does not link with "
                        "-fuse-ld=lld: install lld (Debian: apt install lld) or configure with "
                        "-DCXLKV_LINKER=auto")
  endif()
elseif(NOT CXLKV_LINKER STREQUAL "default")
  message(FATAL_ERROR "CXLKV_LINKER must be auto, lld or default, got '${CXLKV_LINKER}'")
endif()

# CXLKV_DEBUG_INFO=OFF: C and C++ without debug information, whatever the build type.
if(NOT CXLKV_DEBUG_INFO)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-g0>")
endif()
