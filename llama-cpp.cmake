# Included by `make llama-cpp` right after llama.cpp's own project() call (CMAKE_PROJECT_llama.cpp_INCLUDE): the
# Python binding loads only libllama and libggml*, but llama-cpp-python's CMakeLists forces llama.cpp's "common"
# library on (arg parsing, chat templates, JSON, downloads: ~27k lines of C++ that nothing here links), the slowest
# part of the build. Set before llama.cpp's option() reads it, so it wins over the parent's FORCE.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)

# One copy of each library in the wheel. llama.cpp's own install rules put its libraries in the wheel's top-level lib/
# (a site-packages/lib nothing reads) beside llama-cpp-python's llama_cpp/lib, each under three names (libllama.so,
# .so.0, .so.0.x.y) that a wheel stores as three full copies: 6 copies of 10 MB, a 67 MB wheel whose zip (3.8 s on one
# core) and unpacking sat between the compile and the run. Both rules now install into llama_cpp/lib (as
# llama-cpp-python does for Pyodide), and the libraries carry no version in their file names (below).
set(CMAKE_INSTALL_LIBDIR llama_cpp/lib CACHE PATH "libraries, in the Python package" FORCE)
set(CMAKE_INSTALL_INCLUDEDIR llama_cpp/include CACHE PATH "headers, in the Python package" FORCE)

# libllama (model loader, vocabulary, the per-architecture graph builders, KV cache bookkeeping: two thirds of the
# compile) at -O1; ggml, which does the arithmetic, keeps the release build's -O3. Appended to the target's options
# once llama.cpp's CMakeLists has defined it (a deferred call), so it comes after -O3 on the command line and wins.
# Measured: the compile 196 -> 148 s on 2 cores, generation time unchanged (BENCHMARKS.md "Set-up time").
# And libllama's sources that a run of ours never executes, or only once at load (the quantiser, the model saver and
# loader, grammars, chat templates, other architectures' KV caches and memories) join the unity build llama.cpp uses
# for its model graph files (src/CMakeLists.txt leaves its core files out of it), in its batches of 16: libllama
# 141 -> 118 CPU-seconds (74 -> 63 s on 2 cores). The decode path (context, graph, KV cache, batch, sampler, vocab,
# adapters) stays one unit per file: with every core file in the batches (112 CPU-seconds) generation measured up
# to 13 % slower in one alternated comparison; with these, the same within noise and the same tokens (BENCHMARKS.md
# "Set-up time"). One batch of all of libllama does not compile (names clash).
# Then the unity batches at -O0 and the core files at -O1 (per-source options, which come after the target's): the
# batches hold the 157 architectures' graph builders (one of them runs, to build a graph per decode call) and the
# load-time files; and in ggml the files for quantized weights or other devices, at -O1: "repack" layouts and tiled
# kernels for Q4_0/Q4_K/IQ4 weights, the dot products of quantized types, AMX, the multi-device "meta" backend,
# ggml-opt (training inside ggml). The engine runs f16/bf16 GGUFs, which none of them touch. Measured on 2 cores
# (AVX2): the compile 136 -> 124 s (253 -> 228 CPU-seconds), generation the same within noise (6 alternated rounds),
# `export --quant q4_k_m`'s quantiser 2.2-2.3 -> 2.5-2.6 s, the same file byte for byte (BENCHMARKS.md "Set-up time").
function(grpo_llama_compile_options)
    if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        return()
    endif()
    if(TARGET llama)
        set_property(TARGET llama APPEND PROPERTY COMPILE_OPTIONS -O0)
        get_target_property(dir llama SOURCE_DIR)
        get_target_property(sources llama SOURCES)
        set(batched)
        set(core)
        set(load_time "quant|model-saver|model-loader|grammar|chat|kv-cache-(iswa|dsa|dsa-iswa|msa|dsv4)")
        foreach(source IN LISTS sources)
            if(source MATCHES "^llama-(${load_time}|memory-(hybrid|hybrid-iswa|hybrid-idx|recurrent))\\.cpp$")
                list(APPEND batched "${dir}/${source}")
            elseif(source MATCHES "\\.cpp$" AND NOT source MATCHES "^models/")
                list(APPEND core "${dir}/${source}")
            endif()
        endforeach()
        set_source_files_properties(${batched} TARGET_DIRECTORY llama PROPERTIES SKIP_UNITY_BUILD_INCLUSION OFF)
        set_source_files_properties(${core} TARGET_DIRECTORY llama PROPERTIES COMPILE_OPTIONS -O1)
    endif()
    foreach(target llama ggml ggml-base ggml-cpu)
        if(TARGET ${target})
            set_property(TARGET ${target} PROPERTY VERSION)  # unset: libllama.so alone, no .so.0 / .so.0.x.y
            set_property(TARGET ${target} PROPERTY SOVERSION)
        endif()
    endforeach()
    foreach(target ggml-base ggml-cpu)
        if(TARGET ${target})
            get_target_property(dir ${target} SOURCE_DIR)
            get_target_property(sources ${target} SOURCES)
            set(cold)
            foreach(source IN LISTS sources)
                if(source MATCHES "(repack|tiled|tiled-kernel|amx|mmq|ggml-backend-meta|ggml-opt|arch/[^/]+/quants)\\.(c|cpp)$")
                    list(APPEND cold "${dir}/${source}")
                endif()
            endforeach()
            set_source_files_properties(${cold} TARGET_DIRECTORY ${target} PROPERTIES COMPILE_OPTIONS -O1)
        endif()
    endforeach()
endfunction()
cmake_language(DEFER CALL grpo_llama_compile_options)
