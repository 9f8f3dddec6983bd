/* Hot-path helpers for tinyvllm's sampler, loaded with ctypes (tinyvllm/kernels.py). */
#include <stdint.h>

long tv_argmax(const float *values, long n) {
    long best = 0;
    for (long i = 1; i < n; ++i) {
        if (values[i] > values[best]) {
            best = i;
        }
    }
    return best;
}

void tv_bin_counts(const int64_t *ids, long n, float *counts, long vocab_size) {
    for (long i = 0; i < n; ++i) {
        int64_t id = ids[i];
        if (id >= 0 && id < vocab_size) {
            counts[id] += 1.0f;
        }
    }
}
