// llama_model_quantize with an importance matrix, loaded as llama.cpp's tools/quantize does (GGUF format):
// each entry's in_sum2 divided by its per-expert counts (a row never reached: all ones), handed over as the
// llama_model_imatrix_data array the API takes. Written for mreg's tests; compiled against the sdist's
// include/llama.h and the installed llama-cpp-python's libllama.so.
//
// usage: quantize_with_imatrix IN.gguf OUT.gguf FTYPE NTHREAD [IMATRIX.gguf|-] [dry]
// `dry`: llama.cpp's --dry-run (types chosen, nothing written); its log goes to stdout, one line per tensor.
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

static bool load(const char * fname, std::map<std::string, std::vector<float>> & out) {
    ggml_context * ctx = nullptr;
    gguf_init_params params = {/*no_alloc*/ false, &ctx};
    gguf_context * g = gguf_init_from_file(fname, params);
    if (!g) return false;
    std::map<std::string, std::pair<ggml_tensor *, ggml_tensor *>> found;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        std::string name = t->name;
        const std::string s = ".in_sum2", c = ".counts";
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
            found[name.substr(0, name.size() - s.size())].first = t;
        } else if (name.size() > c.size() && name.compare(name.size() - c.size(), c.size(), c) == 0) {
            found[name.substr(0, name.size() - c.size())].second = t;
        }
    }
    for (auto & [name, pair] : found) {
        if (!pair.first || !pair.second) return false;
        const int64_t nval = ggml_nelements(pair.first), ncounts = ggml_nelements(pair.second);
        const int64_t ne0 = nval / ncounts;
        const float * sums = (const float *) pair.first->data;
        const float * counts = (const float *) pair.second->data;
        auto & e = out[name];
        e.resize(nval);
        for (int64_t j = 0; j < ncounts; ++j) {
            const float count = (float) std::lround(counts[j]);
            for (int64_t i = 0; i < ne0; ++i) {
                e[j * ne0 + i] = count > 0.0f ? sums[j * ne0 + i] / count : 1.0f;
            }
        }
    }
    gguf_free(g);
    ggml_free(ctx);
    return true;
}

static void to_stdout(ggml_log_level, const char * text, void *) {
    fputs(text, stdout);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s IN OUT FTYPE NTHREAD [IMATRIX]\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = (llama_ftype) atoi(argv[3]);
    params.nthread = atoi(argv[4]);
    std::map<std::string, std::vector<float>> data;
    std::vector<llama_model_imatrix_data> entries;
    params.dry_run = argc > 6 && strcmp(argv[6], "dry") == 0;
    llama_log_set(params.dry_run ? to_stdout : [](ggml_log_level, const char *, void *) {}, nullptr);
    if (argc > 5 && strcmp(argv[5], "-") != 0) {
        if (!load(argv[5], data)) {
            fprintf(stderr, "cannot load %s\n", argv[5]);
            return 3;
        }
        for (auto & [name, values] : data) entries.push_back({name.c_str(), values.data(), values.size()});
        entries.push_back({nullptr, nullptr, 0});
        params.imatrix = entries.data();
    }
    const uint32_t rc = llama_model_quantize(argv[1], argv[2], &params);
    llama_backend_free();
    return rc == 0 ? 0 : 1;
}
