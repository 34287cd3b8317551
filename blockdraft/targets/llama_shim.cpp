/* blockdraft's bridge to llama.cpp's C API (compiled by `blockdraft engines build llama.cpp`).
 *
 * Why a shim and not ctypes alone: llama.cpp passes `llama_model_params`, `llama_context_params` and
 * `llama_batch` by value, and their layouts change between releases; compiled here against the pinned
 * build's own `llama.h`, the compiler lays them out. Every function below takes and returns plain C
 * types, so `targets/llama_lib.py` binds them with ctypes without knowing any llama.cpp struct.
 *
 * One `bd_engine` is one model and one context: a KV memory whose cells carry sequence ids, which is
 * how rows (one sequence each) and tree branches (a sequence per node) share one verify pass.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ggml-cpu.h"
#include "llama.h"
#include "shim_batch.h"

/* llama.cpp 11434's `src/llama-ext.h` (not an installed header, and C++: these three keep C++ linkage, which
 * is why the shim is C++): the per-layer hidden states its own DFlash draft reads, and the token embedding
 * table. Exported by libllama. */
LLAMA_API void llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
LLAMA_API float * llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
LLAMA_API uint32_t llama_model_get_tok_embd(const struct llama_model * model, float * out);

extern "C" {

typedef struct {
    struct llama_model * model;
    struct llama_context * ctx;
    struct llama_batch batch;
    int32_t batch_tokens; /* the batch's capacity (n_batch) */
    int32_t seq_max;      /* sequence ids per token the batch can hold */
    struct ggml_threadpool * pool; /* the context's worker threads (bd_attach_pool) */
} bd_engine;

static int bd_quiet = 1;

static void bd_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (!bd_quiet || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

void bd_set_quiet(int quiet) { bd_quiet = quiet; }

/* A persistent thread pool for the context, as llama-server keeps one: without it every llama_decode starts
   and joins its worker threads, which on a one-token step of a small model is a visible share of the step.
   Workers poll briefly (llama.cpp's default level, 50) before sleeping, so the next step finds them awake. */
static void bd_attach_pool(bd_engine * engine, int32_t n_threads) {
    llama_detach_threadpool(engine->ctx);
    if (engine->pool != NULL) {
        ggml_threadpool_free(engine->pool);
        engine->pool = NULL;
    }
    struct ggml_threadpool_params pool_params = ggml_threadpool_params_default(n_threads);
    engine->pool = ggml_threadpool_new(&pool_params);
    if (engine->pool != NULL) {
        llama_attach_threadpool(engine->ctx, engine->pool, NULL);
    }
}

/* Load `path` on the CPU; NULL when the model or the context cannot be made (llama.cpp logs why). */
bd_engine * bd_open(const char * path, int32_t n_ctx, int32_t n_batch, int32_t n_seq_max, int32_t n_outputs_max,
                    int32_t n_threads) {
    static int initialised = 0;
    if (!initialised) {
        llama_log_set(bd_log, NULL);
        llama_backend_init();
        initialised = 1;
    }
    struct llama_model_params model_params = llama_model_default_params();
    model_params.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, model_params);
    if (model == NULL) {
        return NULL;
    }
    struct llama_context_params params = llama_context_default_params();
    params.n_ctx = (uint32_t) n_ctx;
    params.n_batch = (uint32_t) n_batch;
    params.n_ubatch = (uint32_t) n_batch; /* one ubatch a decode: layer features come back in batch order */
    params.n_seq_max = (uint32_t) n_seq_max;
    params.n_outputs_max = (uint32_t) n_outputs_max;
    params.n_threads = n_threads;
    params.n_threads_batch = n_threads;
    params.kv_unified = true; /* one cell pool: a tree's branches share the row's past by sequence tags */
    params.no_perf = true;
    struct llama_context * ctx = llama_init_from_model(model, params);
    if (ctx == NULL) {
        llama_model_free(model);
        return NULL;
    }
    bd_engine * engine = (bd_engine *) calloc(1, sizeof(bd_engine));
    engine->model = model;
    engine->ctx = ctx;
    engine->batch = llama_batch_init(n_batch, 0, n_seq_max);
    engine->batch_tokens = n_batch;
    engine->seq_max = n_seq_max;
    bd_attach_pool(engine, n_threads);
    return engine;
}

void bd_close(bd_engine * engine) {
    if (engine == NULL) {
        return;
    }
    llama_batch_free(engine->batch);
    llama_free(engine->ctx);
    if (engine->pool != NULL) {
        ggml_threadpool_free(engine->pool);
    }
    llama_model_free(engine->model);
    free(engine);
}

int32_t bd_n_vocab(const bd_engine * e) { return llama_vocab_n_tokens(llama_model_get_vocab(e->model)); }
int32_t bd_n_embd(const bd_engine * e) { return llama_model_n_embd(e->model); }
int32_t bd_n_layer(const bd_engine * e) { return llama_model_n_layer(e->model); }
int32_t bd_n_ctx_train(const bd_engine * e) { return llama_model_n_ctx_train(e->model); }
int32_t bd_n_ctx(const bd_engine * e) { return (int32_t) llama_n_ctx(e->ctx); }
int32_t bd_is_eog(const bd_engine * e, int32_t token) {
    return llama_vocab_is_eog(llama_model_get_vocab(e->model), token) ? 1 : 0;
}

/* The model's metadata value for `key` as text into buf; its length, or -1 when absent. */
int32_t bd_meta(const bd_engine * e, const char * key, char * buf, int32_t size) {
    return llama_model_meta_val_str(e->model, key, buf, (size_t) size);
}

/* The token embedding table as float32 (n_vocab * n_embd) into out; the element count, 0 on failure. */
uint32_t bd_tok_embd(const bd_engine * e, float * out) { return llama_model_get_tok_embd(e->model, out); }

/* Ask for the input of layer `lid` (= the output of layer lid - 1) of every token of each decode. */
void bd_capture_layer(bd_engine * e, int32_t lid, int32_t on) {
    llama_set_embeddings_layer_inp(e->ctx, (uint32_t) lid, on != 0);
}

void bd_set_threads(bd_engine * e, int32_t n_threads) {
    llama_set_n_threads(e->ctx, n_threads, n_threads);
    bd_attach_pool(e, n_threads);
}

/* One llama_decode over n tokens: token i at pos[i], in the sequences seq_ids[i * seq_stride ...] (n_seq[i]
 * of them; the first is the one it attends as), logits when want[i]. Returns llama_decode's code, or -100
 * when the batch cannot hold the request. */
int32_t bd_decode(bd_engine * e, int32_t n, const int32_t * tokens, const int32_t * pos, const int32_t * n_seq,
                  const int32_t * seq_ids, int32_t seq_stride, const int8_t * want) {
    const int32_t filled = bd_fill_batch(&e->batch, e->batch_tokens, e->seq_max, n, tokens, pos, n_seq, seq_ids,
                                         seq_stride, want);
    if (filled != 0) {
        return filled;
    }
    return llama_decode(e->ctx, e->batch);
}

/* Copy the logits of the batch entries idx[0..n) (each asked for at decode) into out (n * n_vocab). */
int32_t bd_logits(bd_engine * e, int32_t n, const int32_t * idx, float * out) {
    return bd_copy_logits(e->ctx, (size_t) bd_n_vocab(e), n, idx, out);
}

/* Copy the captured input of layer `lid` for the first n entries of the last decode into out (n * n_embd). */
int32_t bd_layer(bd_engine * e, int32_t lid, int32_t n, float * out) {
    const float * data = llama_get_embeddings_layer_inp(e->ctx, (uint32_t) lid);
    if (data == NULL) {
        return -1;
    }
    memcpy(out, data, (size_t) n * (size_t) bd_n_embd(e) * sizeof(float));
    return 0;
}

int32_t bd_seq_rm(bd_engine * e, int32_t seq, int32_t p0, int32_t p1) {
    return llama_memory_seq_rm(llama_get_memory(e->ctx), seq, p0, p1) ? 1 : 0;
}
void bd_seq_cp(bd_engine * e, int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    llama_memory_seq_cp(llama_get_memory(e->ctx), src, dst, p0, p1);
}
int32_t bd_seq_pos_max(bd_engine * e, int32_t seq) { return llama_memory_seq_pos_max(llama_get_memory(e->ctx), seq); }
void bd_clear(bd_engine * e) { llama_memory_clear(llama_get_memory(e->ctx), true); }

}  // extern "C"
