# Included by `make llama-cpp` right after llama.cpp's own project() call (CMAKE_PROJECT_llama.cpp_INCLUDE): the
# Python binding loads only libllama and libggml*, but llama-cpp-python's CMakeLists forces llama.cpp's "common"
# library on (arg parsing, chat templates, JSON, downloads: ~27k lines of C++ that nothing here links), the slowest
# part of the build. Set before llama.cpp's option() reads it, so it wins over the parent's FORCE.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)

# libllama (model loader, vocabulary, the per-architecture graph builders, KV cache bookkeeping: two thirds of the
# compile) at -O1; ggml, which does the arithmetic, keeps the release build's -O3. Appended to the target's options
# once llama.cpp's CMakeLists has defined it (a deferred call), so it comes after -O3 on the command line and wins.
# Measured: the compile 196 -> 148 s on 2 cores, generation time unchanged (BENCHMARKS.md "Set-up time").
function(grpo_llama_compile_options)
    if(TARGET llama AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        set_property(TARGET llama APPEND PROPERTY COMPILE_OPTIONS -O1)
    endif()
endfunction()
cmake_language(DEFER CALL grpo_llama_compile_options)
