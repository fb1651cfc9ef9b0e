# Third-party dependencies, all from Debian 12 packages (scripts/deps installs them).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(absl REQUIRED)

pkg_check_modules(LIBCXL REQUIRED IMPORTED_TARGET libcxl)
pkg_check_modules(LIBDAXCTL REQUIRED IMPORTED_TARGET libdaxctl)
pkg_check_modules(NUMA REQUIRED IMPORTED_TARGET numa)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# The NVMe medium (nvme/src/nvme_store.cc) drives O_DIRECT files through io_uring.
pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
if(NOT LIBURING_FOUND)
  message(FATAL_ERROR "liburing not found: apt-get install liburing-dev (scripts/deps does)")
endif()
# TOML (domain.toml): the orchestrator's configuration and its [placement] section, which
# tier/ parses itself.
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)

set(CXLKV_HAVE_MEMKIND 0)
cxlkv_feature_enabled(MEMKIND _memkind)
if(_memkind)
  pkg_check_modules(MEMKIND IMPORTED_TARGET memkind)
  if(MEMKIND_FOUND)
    set(CXLKV_HAVE_MEMKIND 1)
  else()
    cxlkv_feature_missing(MEMKIND "memkind was not found: apt-get install libmemkind-dev")
  endif()
endif()

find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

if(CXLKV_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(CXLKV_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
