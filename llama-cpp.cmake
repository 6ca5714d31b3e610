# Included by `make llama-cpp` right after llama.cpp's own project() call (CMAKE_PROJECT_llama.cpp_INCLUDE): the
# Python binding loads only libllama and libggml*, but llama-cpp-python's CMakeLists forces llama.cpp's "common"
# library on (arg parsing, chat templates, JSON, downloads: ~27k lines of C++ that nothing here links), the slowest
# part of the build. Set before llama.cpp's option() reads it, so it wins over the parent's FORCE.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)

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
function(grpo_llama_compile_options)
    if(TARGET llama AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        set_property(TARGET llama APPEND PROPERTY COMPILE_OPTIONS -O1)
    endif()
    if(TARGET llama)
        get_target_property(dir llama SOURCE_DIR)
        get_target_property(sources llama SOURCES)
        set(batched)
        set(load_time "quant|model-saver|model-loader|grammar|chat|kv-cache-(iswa|dsa|dsa-iswa|msa|dsv4)")
        foreach(source IN LISTS sources)
            if(source MATCHES "^llama-(${load_time}|memory-(hybrid|hybrid-iswa|hybrid-idx|recurrent))\\.cpp$")
                list(APPEND batched "${dir}/${source}")
            endif()
        endforeach()
        set_source_files_properties(${batched} TARGET_DIRECTORY llama PROPERTIES SKIP_UNITY_BUILD_INCLUSION OFF)
    endif()
endfunction()
cmake_language(DEFER CALL grpo_llama_compile_options)
