/* gpu_probe.c — the GPU gate of tests/gpu_ready.h as a program, for CTest to run before a command
 * that is not a test of ours (the `flce fuzz` smoke run, whose own check says "no GPU: skipped"
 * for a broken driver too): exit 0 = a usable GPU, 77 = skipped, 1 = broken or FLCE_REQUIRE_GPU
 * not met. */
#include "gpu_ready.h"

int main(void)
{
    int rc;
    (void)check_passed, (void)check_failed; /* check.h's counters: no cases run here */
    gpu_ready(1, &rc);
    return rc;
}
