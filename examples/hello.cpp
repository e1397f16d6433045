// hello.cpp — flce.h from C++ (issue 17): the header compiles as C++ with warnings as errors and
// links without name mangling. The same steps as hello.c; the CPU part runs without a GPU.
//   pkg-config:  c++ hello.cpp $(pkg-config --cflags --libs flce) -Wl,-rpath,$(pkg-config --variable=libdir flce) -o hello_cpp
#include <flce.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace {
struct context_deleter {
    void operator()(flce_context *ctx) const { flce_context_destroy(ctx); }
};
using context_ptr = std::unique_ptr<flce_context, context_deleter>;
} // namespace

int main()
{
    const std::string version = flce_version();
    std::printf("flce %s from C++ (header %s)\n", version.c_str(), FLCE_VERSION_STRING);

    flce_problem problem;
    flce_problem_init(&problem);
    problem.tokens = 1024;
    problem.hidden = 4096;
    problem.vocab_shard = 128256;
    problem.dtype = FLCE_DTYPE_F16;
    problem.reduction = FLCE_REDUCTION_SUM;
    if (flce_problem_validate(&problem) != FLCE_OK) {
        std::fprintf(stderr, "invalid problem: %s\n", flce_last_error());
        return 1;
    }
    std::printf("problem valid\n");

    flce_context *raw = nullptr;
    if (flce_context_create(0, &raw) != FLCE_OK) {
        std::printf("no GPU: %s\n", flce_last_error());
        return 0;
    }
    context_ptr ctx(raw);
    std::uint64_t bytes = 0;
    if (flce_workspace_size(ctx.get(), &problem, FLCE_OP_FORWARD, &bytes) != FLCE_OK) {
        std::fprintf(stderr, "flce_workspace_size: %s\n", flce_last_error());
        return 1;
    }
    std::printf("forward workspace: %.1f MiB\n", static_cast<double>(bytes) / 1048576.0);
    return 0;
}
