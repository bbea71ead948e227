// An importance matrix computed by llama.cpp itself, accumulated as tools/imatrix/imatrix.cpp does: llama.cpp's
// eval callback (cb_eval) sees every matrix product; for MUL_MAT of a `blk.*` weight with at least 16 F32 input
// rows, each input row's squares are added to its tensor's sums (one count per row); for MUL_MAT_ID (experts),
// each routed (token, expert) pair adds to that expert's row and count. The text is tokenized with BOS as
// llama-imatrix does and fed in chunks of N_CTX tokens (whole chunks only), each starting with BOS; the file is
// written in llama-imatrix's GGUF format. Written for mreg's tests.
//
// usage: imatrix_by_eval_callback MODEL.gguf TEXT N_CTX OUT.gguf NTHREAD
#include "ggml.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

struct Stats {
    std::vector<float> values;
    std::vector<int64_t> counts;
};

static std::map<std::string, Stats> g_stats;
static std::vector<char> g_buf, g_ids;

static std::string weight_name(const char * name) {
    const char * p = strchr(name, '#');
    if (!p) return name;
    const char * q = strchr(p + 1, '#');
    return q ? std::string(p + 1, q - p - 1) : std::string(p + 1);
}

static bool collect(ggml_tensor * t, bool ask, void *) {
    const ggml_tensor * src0 = t->src[0];
    const ggml_tensor * src1 = t->src[1];
    std::string wname = weight_name(src0->name);
    if (ask) {
        if (t->op == GGML_OP_MUL_MAT_ID) return true;
        if (t->op != GGML_OP_MUL_MAT) return false;
        if (src1->ne[1] < 16 || src1->type != GGML_TYPE_F32) return false;
        return wname.substr(0, 4) == "blk.";
    }
    const bool is_host = ggml_backend_buffer_is_host(src1->buffer);
    if (!is_host) {
        g_buf.resize(ggml_nbytes(src1));
        ggml_backend_tensor_get(src1, g_buf.data(), 0, ggml_nbytes(src1));
    }
    const char * data = is_host ? (const char *) src1->data : g_buf.data();
    if (t->op == GGML_OP_MUL_MAT_ID) {
        const ggml_tensor * ids = t->src[2];
        const int64_t n_as = src0->ne[2], n_ids = ids->ne[0];
        g_ids.resize(ggml_nbytes(ids));
        ggml_backend_tensor_get(ids, g_ids.data(), 0, ggml_nbytes(ids));
        auto & e = g_stats[wname];
        if (e.values.empty()) {
            e.values.resize(src1->ne[0] * n_as, 0);
            e.counts.resize(n_as, 0);
        }
        const int64_t ne0 = src1->ne[0], n_tokens = src1->ne[2];
        for (int64_t idx = 0; idx < n_ids; ++idx) {
            for (int64_t row = 0; row < n_tokens; ++row) {
                const int32_t ex = *(const int32_t *) (g_ids.data() + row * ids->nb[1] + idx * ids->nb[0]);
                const int64_t i11 = idx % src1->ne[1];
                const float * x = (const float *) (data + i11 * src1->nb[1] + row * src1->nb[2]);
                float * acc = e.values.data() + ex * ne0;
                e.counts[ex]++;
                for (int64_t j = 0; j < ne0; ++j) acc[j] += x[j] * x[j];
            }
        }
    } else {
        auto & e = g_stats[wname];
        const int64_t n_mat = src0->ne[2] * src0->ne[3];
        if (e.values.empty()) {
            e.values.resize(src1->ne[0] * n_mat, 0);
            e.counts.resize(1, 0);
        }
        const int64_t ne0 = src1->ne[0];
        for (int64_t i3 = 0; i3 < src1->ne[3]; ++i3) {
            for (int64_t i2 = 0; i2 < src1->ne[2]; ++i2) {
                const int64_t mat_id = (i3 % src0->ne[3]) * src0->ne[2] + (i2 % src0->ne[2]);
                float * acc = e.values.data() + mat_id * ne0;
                for (int64_t row = 0; row < src1->ne[1]; ++row) {
                    const float * x = (const float *) (data + row * src1->nb[1] + i2 * src1->nb[2] + i3 * src1->nb[3]);
                    for (int64_t j = 0; j < ne0; ++j) acc[j] += x[j] * x[j];
                }
            }
        }
        e.counts[0] += ggml_nrows(src1) / n_mat;
    }
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL TEXT N_CTX OUT NTHREAD\n", argv[0]);
        return 2;
    }
    const int n_ctx = atoi(argv[3]);
    std::ifstream in(argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;  // mreg's policy (converters/gguf/llama.py): no repacked CPU kernels
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 3;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> tokens(text.size() + 16);
    const int n = llama_tokenize(vocab, text.c_str(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                                 /*add_special*/ true, /*parse_special*/ false);
    if (n < 2 * n_ctx) {
        fprintf(stderr, "only %d tokens\n", n);
        return 4;
    }
    tokens.resize(n);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = cp.n_threads_batch = atoi(argv[5]);
    cp.cb_eval = collect;
    cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) return 5;
    const bool add_bos = llama_vocab_get_add_bos(vocab);
    const int n_chunk = n / n_ctx;
    for (int i = 0; i < n_chunk; ++i) {
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> chunk(tokens.begin() + i * n_ctx, tokens.begin() + (i + 1) * n_ctx);
        if (add_bos) chunk[0] = llama_vocab_bos(vocab);
        llama_batch batch = llama_batch_init(n_ctx, 0, 1);
        for (int k = 0; k < n_ctx; ++k) {
            batch.token[k] = chunk[k];
            batch.pos[k] = k;
            batch.n_seq_id[k] = 1;
            batch.seq_id[k][0] = 0;
            batch.logits[k] = true;
        }
        batch.n_tokens = n_ctx;
        if (llama_decode(ctx, batch)) return 6;
        llama_batch_free(batch);
    }

    size_t size = 0;
    for (auto & kv : g_stats) size += 2 * (ggml_tensor_overhead() + 4 * kv.second.values.size() + 64);
    ggml_init_params ip = {size + 1024 * 1024, nullptr, false};
    ggml_context * gctx = ggml_init(ip);
    gguf_context * out = gguf_init_empty();
    const char * datasets[] = {argv[2]};
    gguf_set_val_str(out, "general.type", "imatrix");
    gguf_set_arr_str(out, "imatrix.datasets", datasets, 1);
    gguf_set_val_u32(out, "imatrix.chunk_count", n_chunk);
    gguf_set_val_u32(out, "imatrix.chunk_size", n_ctx);
    for (auto & [name, st] : g_stats) {  // std::map: sorted by name, as llama-imatrix writes them
        const int64_t nmat = st.counts.size(), nval = st.values.size();
        ggml_tensor * sums = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, nval / nmat, nmat);
        ggml_tensor * counts = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, 1, nmat);
        ggml_format_name(sums, "%s.in_sum2", name.c_str());
        ggml_format_name(counts, "%s.counts", name.c_str());
        for (int64_t j = 0; j < nval; ++j) ((float *) sums->data)[j] = st.values[j];
        for (int64_t j = 0; j < nmat; ++j) ((float *) counts->data)[j] = (float) st.counts[j];
        gguf_add_tensor(out, sums);
        gguf_add_tensor(out, counts);
    }
    const bool ok = gguf_write_to_file(out, argv[4], false);
    gguf_free(out);
    ggml_free(gctx);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return ok ? 0 : 7;
}
