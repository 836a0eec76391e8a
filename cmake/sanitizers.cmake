# STRATA_SANITIZE=address,undefined builds everything (strata's code, its tests, the testbed) with
# those sanitizers. `make test-asan` uses it for the unit tests. BPF objects are compiled by their own
# clang rule and are not affected.
set(STRATA_SANITIZE "" CACHE STRING "comma-separated sanitizers (address,undefined,...); empty: none")

if(STRATA_SANITIZE)
  string(REPLACE "," ";" strata_sanitizers "${STRATA_SANITIZE}")
  foreach(s IN LISTS strata_sanitizers)
    if(NOT s MATCHES "^(address|undefined|leak|thread)$")
      message(FATAL_ERROR "STRATA_SANITIZE: unknown sanitizer '${s}' (address, undefined, leak, thread)")
    endif()
  endforeach()
  string(REPLACE ";" "," strata_sanitize_list "${strata_sanitizers}")
  # -fno-sanitize-recover: a UBSan finding fails the test instead of scrolling past in its log.
  add_compile_options(-fsanitize=${strata_sanitize_list} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${strata_sanitize_list})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12's -Wmaybe-uninitialized misfires on libstdc++ (std::regex, std::function) once ASan
    # instruments it: false positives that -Werror would turn into a failed build.
    add_compile_options(-Wno-maybe-uninitialized)
  endif()
  message(STATUS "strata: sanitizers ${strata_sanitize_list}")
endif()

# STRATA_FUZZ=ON (clang only): libFuzzer binaries of tests/fuzz/ (bin/fuzz_<name>). Everything is
# compiled with fuzzer coverage, and with ASan + UBSan unless STRATA_SANITIZE says otherwise, so a
# memory error is a crash the fuzzer keeps. The replay tests of the same targets build without it.
option(STRATA_FUZZ "build the libFuzzer targets of tests/fuzz (clang)" OFF)
if(STRATA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRATA_FUZZ needs clang: cmake -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ ...")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
  if(NOT STRATA_SANITIZE)
    add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all)
    add_link_options(-fsanitize=address,undefined)
  endif()
endif()
