// Linked into every fuzz target. The ASan build links the shared ASan runtime (the preload
// shim's tests need it: cmake/CxlkvFlags.cmake), and clang's libFuzzer driver puts libstdc++
// ahead of it in the executable's library list, which ASan refuses at start ("ASan runtime does
// not come first"). libstdc++ defines none of the functions ASan intercepts, so the order is
// harmless here and the check is turned off for the fuzzers only.
extern "C" const char* __asan_default_options() { return "verify_asan_link_order=0"; }
