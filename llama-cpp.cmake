# Included by `make llama-cpp` right after llama.cpp's own project() call (CMAKE_PROJECT_llama.cpp_INCLUDE): the
# Python binding loads only libllama and libggml*, but llama-cpp-python's CMakeLists forces llama.cpp's "common"
# library on (arg parsing, chat templates, JSON, downloads: ~27k lines of C++ that nothing here links), the slowest
# part of the build. Set before llama.cpp's option() reads it, so it wins over the parent's FORCE.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
