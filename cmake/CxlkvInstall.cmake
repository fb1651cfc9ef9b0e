# Install rules: what `cmake --install <build> --prefix P` puts under P (GNUInstallDirs names,
# relative to P):
#   ${libdir}/libcxlkv.so.0.1.0, libcxlkv.so.0, libcxlkv.so   the C API (SONAME libcxlkv.so.0)
#   ${includedir}/cxlkv/cxlkv.h                               its header, the only public one
#   ${libdir}/libcxlkv_preload.so                             the LD_PRELOAD shim, beside
#                                                             libcxlkv.so.0 (its pooled mode
#                                                             loads the library from there)
#   ${libdir}/liblmcache_shared_l1_visibility.so              LMCache's shared-L1 visibility
#                                                             ABI (its
#                                                             --l1-shared-visibility-library-path);
#   ${includedir}/cxlkv/lmcache/visibility.h                  its declaration (docs/lmcache.md)
#   ${bindir}/cxlkvctl, ${bindir}/cxlkv-orchestrator
#   lib/systemd/system/cxlkv-orchestrator@.service            CXLKV_SYSTEMD_UNIT_DIR; its
#                                                             paths point into P
#   ${libdir}/pkgconfig/cxlkv.pc                              pkg-config --cflags --libs cxlkv
#   ${libdir}/cmake/cxlkv/                                    find_package(cxlkv) -> cxlkv::cxlkv
#   ${docdir}/                                                README.md, orchestrator.md, the
#                                                             example domain configuration
#   CXLKV_PYTHON_INSTALL_DIR/cxlkv/                           the Python package (python/cxlkv),
#                                                             with _install_paths.py naming
#                                                             libcxlkv.so.0 relative to it
#                                                             (CXLKV_INSTALL_PYTHON=OFF: left out)
# Targets are named, never located, so the modules can move between directories. Included at
# the end of the root CMakeLists.txt, once every target exists. tests/install/run.sh checks it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CXLKV_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the orchestrator's systemd unit is installed (relative to the prefix, or absolute)")
set(CXLKV_CMAKE_PACKAGE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/cxlkv")

# The C API. Its include directory is the source tree's include/ while building
# (capi/CMakeLists.txt) and ${includedir} once installed (INCLUDES DESTINATION).
install(TARGETS cxlkv EXPORT cxlkvTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/cxlkv/cxlkv.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cxlkv)

install(TARGETS cxlkv_preload LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# No SONAME versioning: LMCache loads it by absolute path, and the ABI's version is the
# symbol's name (lmcache_shared_l1_visibility_v1).
install(TARGETS lmcache_shared_l1_visibility LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/integrations/lmcache/include/cxlkv/lmcache/visibility.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cxlkv/lmcache)
install(TARGETS cxlkvctl cxlkv-orchestrator RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The systemd unit names /usr/bin and /usr/share/doc/cxlkv (a package's prefix). The prefix is
# only known when installing (--prefix), so the copy is rewritten then, and installed from the
# build tree; with --prefix /usr it is the unit as written.
set(_cxlkv_unit_src "${PROJECT_SOURCE_DIR}/orchestrator/systemd/cxlkv-orchestrator@.service")
set(_cxlkv_unit_out "${PROJECT_BINARY_DIR}/install/cxlkv-orchestrator@.service")
foreach(_dir BINDIR DOCDIR)  # the install-time prefix, unless the directory is absolute
  set(_cxlkv_unit_${_dir} "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_${_dir}}")
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(_cxlkv_unit_${_dir} "${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
install(CODE "
  file(READ [[${_cxlkv_unit_src}]] unit)
  string(REPLACE \"/usr/bin/\" \"${_cxlkv_unit_BINDIR}/\" unit \"\${unit}\")
  string(REPLACE \"/usr/share/doc/cxlkv/\" \"${_cxlkv_unit_DOCDIR}/\" unit \"\${unit}\")
  file(WRITE [[${_cxlkv_unit_out}]] \"\${unit}\")
")
install(FILES ${_cxlkv_unit_out} DESTINATION ${CXLKV_SYSTEMD_UNIT_DIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/orchestrator.md
              ${PROJECT_SOURCE_DIR}/orchestrator/domain.example.toml
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

# pkg-config: paths relative to the .pc file (${pcfiledir}), so the prefix can be chosen at
# install time or the tree moved afterwards.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(_cxlkv_pc_prefix "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _cxlkv_pc_up "/P/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/P")
  string(REGEX REPLACE "/$" "" _cxlkv_pc_up "${_cxlkv_pc_up}")
  set(_cxlkv_pc_prefix "\${pcfiledir}/${_cxlkv_pc_up}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_cxlkv_pc_libdir "${CMAKE_INSTALL_LIBDIR}")
else()
  set(_cxlkv_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(_cxlkv_pc_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(_cxlkv_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/install/cxlkv.pc" @ONLY CONTENT
"prefix=@_cxlkv_pc_prefix@
libdir=@_cxlkv_pc_libdir@
includedir=@_cxlkv_pc_includedir@

Name: cxlkv
Description: CXL memory tier for LLM KV caches: pools, KV arenas and the block allocator (C API)
Version: @PROJECT_VERSION@
Cflags: -I\${includedir}
Libs: -L\${libdir} -lcxlkv
")
install(FILES "${PROJECT_BINARY_DIR}/install/cxlkv.pc"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The CMake package: find_package(cxlkv) gives the imported target cxlkv::cxlkv.
install(EXPORT cxlkvTargets NAMESPACE cxlkv:: FILE cxlkvTargets.cmake
        DESTINATION ${CXLKV_CMAKE_PACKAGE_DIR})
# (file(WRITE), not file(CONFIGURE): @PACKAGE_INIT@ is for configure_package_config_file.)
file(WRITE "${PROJECT_BINARY_DIR}/install/cxlkvConfig.cmake.in"
"# cxlkv ${PROJECT_VERSION}: find_package(cxlkv) defines the imported target cxlkv::cxlkv
# (libcxlkv.so and include/cxlkv/cxlkv.h). See README.md, \"Install\".
@PACKAGE_INIT@
include(\"\${CMAKE_CURRENT_LIST_DIR}/cxlkvTargets.cmake\")
check_required_components(cxlkv)
")
configure_package_config_file("${PROJECT_BINARY_DIR}/install/cxlkvConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/install/cxlkvConfig.cmake"
                              INSTALL_DESTINATION ${CXLKV_CMAKE_PACKAGE_DIR})
# The same major version: the SONAME (libcxlkv.so.<major>) is the ABI promise.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/install/cxlkvConfigVersion.cmake"
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/install/cxlkvConfig.cmake"
              "${PROJECT_BINARY_DIR}/install/cxlkvConfigVersion.cmake"
        DESTINATION ${CXLKV_CMAKE_PACKAGE_DIR})

# The Python package (python/cxlkv, a ctypes binding: no compiled part). Installed as plain
# files where Debian's python3 looks: lib/python3.<minor>/dist-packages is on its sys.path
# under both /usr and /usr/local. The interpreter named by CXLKV_PYTHON gives <minor>;
# another prefix needs PYTHONPATH=<prefix>/<dir>. _install_paths.py, written at install time,
# names the installed libcxlkv.so.0 relative to the package, so a DESTDIR staging or a moved
# prefix still finds it.
option(CXLKV_INSTALL_PYTHON "Install the Python package" ON)
if(CXLKV_INSTALL_PYTHON)
  set(CXLKV_PYTHON "/usr/bin/python3" CACHE FILEPATH
      "The Python interpreter the package is installed for (Debian's sees python3-numpy)")
  set(_cxlkv_py_dir "lib/python3/dist-packages")
  if(EXISTS "${CXLKV_PYTHON}")
    execute_process(COMMAND "${CXLKV_PYTHON}" -c
                    "import sys; print('%d.%d' % sys.version_info[:2])"
                    OUTPUT_VARIABLE _cxlkv_py_ver OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _cxlkv_py_rc)
    if(_cxlkv_py_rc EQUAL 0 AND _cxlkv_py_ver MATCHES "^3\\.[0-9]+$")
      set(_cxlkv_py_dir "lib/python${_cxlkv_py_ver}/dist-packages")
    endif()
  endif()
  set(CXLKV_PYTHON_INSTALL_DIR "${_cxlkv_py_dir}" CACHE STRING
      "Where the Python package is installed (relative to the prefix, or absolute)")
  # tests/install/run.sh reads it from here (this file is included after tests/).
  set_property(TARGET cxlkv PROPERTY CXLKV_PYTHON_INSTALL_DIR "${CXLKV_PYTHON_INSTALL_DIR}")
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/cxlkv DESTINATION ${CXLKV_PYTHON_INSTALL_DIR}
          FILES_MATCHING PATTERN "*.py" PATTERN "py.typed" PATTERN "__pycache__" EXCLUDE)
  # (An install script, so the prefix is the one given at install time.)
  file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/install/python_paths.cmake" @ONLY CONTENT [==[
set(_py [[@CXLKV_PYTHON_INSTALL_DIR@]])
set(_lib [[@CMAKE_INSTALL_LIBDIR@]])
if(NOT IS_ABSOLUTE "${_py}")
  set(_py "${CMAKE_INSTALL_PREFIX}/${_py}")
endif()
if(NOT IS_ABSOLUTE "${_lib}")
  set(_lib "${CMAKE_INSTALL_PREFIX}/${_lib}")
endif()
file(RELATIVE_PATH _rel "${_py}/cxlkv" "${_lib}/libcxlkv.so.0")
file(WRITE "$ENV{DESTDIR}${_py}/cxlkv/_install_paths.py"
"\"\"\"Written by cmake --install: the installed libcxlkv.so.0, relative to this package.\"\"\"
LIBRARY_RELATIVE_TO_PACKAGE = \"${_rel}\"
")
message(STATUS "Python package: ${_py}/cxlkv (libcxlkv.so.0: ${_rel} from it)")
# The distribution's metadata and entry points (vllm.general_plugins), as pip leaves them,
# from python/pyproject.toml: importlib.metadata (and so vLLM's plugin loader) finds them.
execute_process(COMMAND [[@CXLKV_PYTHON@]] [[@PROJECT_SOURCE_DIR@/cmake/python_dist_info.py]]
                        [[@PROJECT_SOURCE_DIR@/python/pyproject.toml]] "$ENV{DESTDIR}${_py}"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _di OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "writing the Python dist-info failed: ${_err}")
endif()
message(STATUS "Python distribution metadata: ${_py}/${_di}")
]==])
  install(SCRIPT "${PROJECT_BINARY_DIR}/install/python_paths.cmake")
endif()
