/* blockdraft's bridge to ik_llama.cpp's C API: the same `bd_*` functions as `llama_shim.cpp` (so one ctypes
 * binding serves both builds), compiled against the ik_llama.cpp build's own `llama.h`.
 *
 * Where ik_llama.cpp's API differs from llama.cpp 11434's:
 * - the KV cache is addressed through the context (`llama_kv_cache_seq_*`), one cell pool whose cells carry
 *   sequence ids, as a unified llama.cpp cache: rows and tree branches share a pass the same way;
 * - weights are repacked at load (`repack_tensors`, ik_llama.cpp's run-time repacking) into the layouts its
 *   multi-row kernels read, which is what makes a k-token pass cheap on a CPU;
 * - there is no layer-input capture: a layer's input is the previous layer's output, which every graph names
 *   `l_out-<layer>` (the embeddings `inp_embd` for layer 0), read through the scheduler's eval callback;
 * - the token embedding table is dequantised here with ggml's own row converter;
 * - threads: ggml's OpenMP pool persists between decodes, so no thread pool object is kept.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml.h"
#include "llama.h"
#include "shim_batch.h"

extern "C" {

#define BD_MAX_LAYERS 512

typedef struct {
    struct llama_model * model;
    struct llama_context * ctx;
    struct llama_batch batch;
    int32_t batch_tokens; /* the batch's capacity (n_batch) */
    int32_t seq_max;      /* sequence ids per token the batch can hold */
    char capture[BD_MAX_LAYERS];               /* layer inputs asked for */
    std::vector<float> * captured[BD_MAX_LAYERS]; /* their values from the last decode (n * n_embd) */
} bd_engine;

static int bd_quiet = 1;

static void bd_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (!bd_quiet || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

void bd_set_quiet(int quiet) { bd_quiet = quiet; }

/* The layer whose input `t` is, when it is one asked for: `l_out-<i>` feeds layer i + 1, `inp_embd` layer 0. */
static int bd_layer_of(const bd_engine * e, const struct ggml_tensor * t) {
    int lid = -1;
    if (strncmp(t->name, "l_out-", 6) == 0) {
        lid = atoi(t->name + 6) + 1;
    } else if (strcmp(t->name, "inp_embd") == 0) {
        lid = 0;
    }
    return lid >= 0 && lid < BD_MAX_LAYERS && e->capture[lid] ? lid : -1;
}

/* The scheduler's eval callback: asked whether a tensor is wanted, then handed it once computed (CPU memory). */
static bool bd_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    bd_engine * e = (bd_engine *) user_data;
    const int lid = bd_layer_of(e, t);
    if (ask) {
        return lid >= 0;
    }
    if (lid >= 0 && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t)) {
        std::vector<float> * out = e->captured[lid];
        out->assign((const float *) t->data, (const float *) t->data + ggml_nelements(t));
    }
    return true;
}

bd_engine * bd_open(const char * path, int32_t n_ctx, int32_t n_batch, int32_t n_seq_max, int32_t n_outputs_max,
                    int32_t n_threads) {
    (void) n_outputs_max; /* ik_llama.cpp sizes its output buffer from n_batch */
    static int initialised = 0;
    if (!initialised) {
        llama_log_set(bd_log, NULL);
        llama_backend_init();
        initialised = 1;
    }
    struct llama_model_params model_params = llama_model_default_params();
    model_params.n_gpu_layers = 0;
    model_params.repack_tensors = true;
    model_params.use_mmap = false; /* repacking rewrites the weights in memory */
    struct llama_model * model = llama_model_load_from_file(path, model_params);
    if (model == NULL) {
        return NULL;
    }
    bd_engine * engine = (bd_engine *) calloc(1, sizeof(bd_engine));
    struct llama_context_params params = llama_context_default_params();
    params.n_ctx = (uint32_t) n_ctx;
    params.n_batch = (uint32_t) n_batch;
    params.n_ubatch = (uint32_t) n_batch; /* one ubatch a decode: layer features come back in batch order */
    params.n_seq_max = (uint32_t) n_seq_max;
    params.n_threads = (uint32_t) n_threads;
    params.n_threads_batch = (uint32_t) n_threads;
    params.cb_eval = bd_eval;
    params.cb_eval_user_data = engine;
    struct llama_context * ctx = llama_init_from_model(model, params);
    if (ctx == NULL) {
        llama_free_model(model);
        free(engine);
        return NULL;
    }
    engine->model = model;
    engine->ctx = ctx;
    engine->batch = llama_batch_init(n_batch, 0, n_seq_max);
    engine->batch_tokens = n_batch;
    engine->seq_max = n_seq_max;
    for (int i = 0; i < BD_MAX_LAYERS; ++i) {
        engine->captured[i] = new std::vector<float>();
    }
    return engine;
}

void bd_close(bd_engine * engine) {
    if (engine == NULL) {
        return;
    }
    llama_batch_free(engine->batch);
    llama_free(engine->ctx);
    llama_free_model(engine->model);
    for (int i = 0; i < BD_MAX_LAYERS; ++i) {
        delete engine->captured[i];
    }
    free(engine);
}

int32_t bd_n_vocab(const bd_engine * e) { return llama_n_vocab(e->model); }
int32_t bd_n_embd(const bd_engine * e) { return llama_model_n_embd(e->model); }
int32_t bd_n_layer(const bd_engine * e) { return llama_n_layer(e->model); }
int32_t bd_n_ctx_train(const bd_engine * e) { return llama_n_ctx_train(e->model); }
int32_t bd_n_ctx(const bd_engine * e) { return (int32_t) llama_n_ctx(e->ctx); }
int32_t bd_is_eog(const bd_engine * e, int32_t token) {
    return llama_vocab_is_eog(llama_model_get_vocab(e->model), token) ? 1 : 0;
}

int32_t bd_meta(const bd_engine * e, const char * key, char * buf, int32_t size) {
    return llama_model_meta_val_str(e->model, key, buf, (size_t) size);
}

/* The token embedding table as float32 (n_vocab * n_embd) into out; the element count, 0 on failure. */
uint32_t bd_tok_embd(const bd_engine * e, float * out) {
    struct ggml_tensor * table = llama_get_model_tensor(e->model, "token_embd.weight");
    if (table == NULL) {
        return 0;
    }
    const int64_t n_embd = table->ne[0], n_vocab = table->ne[1];
    if (table->type == GGML_TYPE_F32) {
        memcpy(out, table->data, (size_t) (n_embd * n_vocab) * sizeof(float));
    } else {
        ggml_type_traits_t traits = ggml_internal_get_type_traits(table->type);
        if (traits.to_float == NULL) {
            return 0;
        }
        for (int64_t row = 0; row < n_vocab; ++row) {
            traits.to_float((const char *) table->data + row * table->nb[1], out + row * n_embd, n_embd);
        }
    }
    return (uint32_t) (n_embd * n_vocab);
}

void bd_capture_layer(bd_engine * e, int32_t lid, int32_t on) {
    if (lid >= 0 && lid < BD_MAX_LAYERS) {
        e->capture[lid] = on != 0;
    }
}

void bd_set_threads(bd_engine * e, int32_t n_threads) {
    llama_set_n_threads(e->ctx, (uint32_t) n_threads, (uint32_t) n_threads);
}

int32_t bd_decode(bd_engine * e, int32_t n, const int32_t * tokens, const int32_t * pos, const int32_t * n_seq,
                  const int32_t * seq_ids, int32_t seq_stride, const int8_t * want) {
    const int32_t filled = bd_fill_batch(&e->batch, e->batch_tokens, e->seq_max, n, tokens, pos, n_seq, seq_ids,
                                         seq_stride, want);
    if (filled != 0) {
        return filled;
    }
    return llama_decode(e->ctx, e->batch);
}

int32_t bd_logits(bd_engine * e, int32_t n, const int32_t * idx, float * out) {
    return bd_copy_logits(e->ctx, (size_t) bd_n_vocab(e), n, idx, out);
}

int32_t bd_layer(bd_engine * e, int32_t lid, int32_t n, float * out) {
    if (lid < 0 || lid >= BD_MAX_LAYERS || !e->capture[lid]) {
        return -1;
    }
    const std::vector<float> & values = *e->captured[lid];
    const size_t count = (size_t) n * (size_t) bd_n_embd(e);
    if (values.size() < count) {
        return -1;
    }
    memcpy(out, values.data(), count * sizeof(float));
    return 0;
}

int32_t bd_seq_rm(bd_engine * e, int32_t seq, int32_t p0, int32_t p1) {
    return llama_kv_cache_seq_rm(e->ctx, seq, p0, p1) ? 1 : 0;
}
void bd_seq_cp(bd_engine * e, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    llama_kv_cache_seq_cp(e->ctx, src, dst, p0, p1);
}
int32_t bd_seq_pos_max(bd_engine * e, int32_t seq) { return llama_kv_cache_seq_pos_max(e->ctx, seq); }
void bd_clear(bd_engine * e) { llama_kv_cache_clear(e->ctx); }

}  // extern "C"
