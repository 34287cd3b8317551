/* What blockdraft's two shims (`llama_shim.cpp` for llama.cpp, `ik_shim.cpp` for ik_llama.cpp) share: both engines
 * lay out `llama_batch` and hand out logits alike, so one decode request and one logits copy serve both. Included
 * by each shim (its compiled library's name carries this file's hash too: `targets/llama_lib.py`). */
#include <cstdint>
#include <cstring>

#include "llama.h"

/* Fill `batch` (capacity tokens, seq_max sequence ids a token) with token i at pos[i], in the sequences
 * seq_ids[i * seq_stride ...] (n_seq[i] of them; the first is the one it attends as), logits when want[i].
 * Returns 0, or -100 when the batch cannot hold the request. */
static int32_t bd_fill_batch(struct llama_batch * batch, int32_t capacity, int32_t seq_max, int32_t n,
                             const int32_t * tokens, const int32_t * pos, const int32_t * n_seq,
                             const int32_t * seq_ids, int32_t seq_stride, const int8_t * want) {
    if (n > capacity) {
        return -100;
    }
    for (int32_t i = 0; i < n; ++i) {
        if (n_seq[i] < 1 || n_seq[i] > seq_max) {
            return -100;
        }
        batch->token[i] = tokens[i];
        batch->pos[i] = pos[i];
        batch->n_seq_id[i] = n_seq[i];
        for (int32_t s = 0; s < n_seq[i]; ++s) {
            batch->seq_id[i][s] = seq_ids[(size_t) i * seq_stride + s];
        }
        batch->logits[i] = want[i];
    }
    batch->n_tokens = n;
    return 0;
}

/* Copy the logits of the batch entries idx[0..n) (each asked for at decode) into out (n * n_vocab); -1 when one
 * has none. */
static int32_t bd_copy_logits(struct llama_context * ctx, size_t n_vocab, int32_t n, const int32_t * idx,
                              float * out) {
    for (int32_t k = 0; k < n; ++k) {
        const float * row = llama_get_logits_ith(ctx, idx[k]);
        if (row == NULL) {
            return -1;
        }
        memcpy(out + (size_t) k * n_vocab, row, n_vocab * sizeof(float));
    }
    return 0;
}
