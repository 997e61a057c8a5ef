// pleio-llama-driver: prefill a token stream through libllama, for pleio's llama.cpp checks.
//
//   pleio-llama-driver -m MODEL -t TOKENS [--ubatch 64] [--batch N] [--threads 2]
//                      [--lazy on|auto|off] [--load-mode none|mmap]
//                      [--capture DIR] [--expect-op get_rows|pleio]
//                      [--logits FILE] [--runs N] [--decode N] [--json FILE]
//                      [--expect-lookahead] [--verbose]
//
// TOKENS holds token ids separated by whitespace or commas, one sequence, positions from 0.
// The prompt goes through llama_decode in chunks of --batch tokens (default: --ubatch), so
// llama splits nothing further and every chunk is one ubatch.
//
// --capture DIR   the PLE gather node, seen through llama's eval callback (cb_eval): its row ids
//                 in DIR/rows.txt (one per line, in the order llama asked for them) and the
//                 gathered rows as little-endian f32 in DIR/rows.f32. The node is ggml_get_rows
//                 on per_layer_token_embd.weight (stock) or the provider's custom op (pleio);
//                 --expect-op makes any other kind, or no node at all, an error.
// --logits FILE   the logits of every position, f32 [n_tokens + N decode steps][n_vocab], in
//                 token order.
// --runs N        prefill N times in one process (memory cleared in between): run 1 is "cold"
//                 when the caller evicted the table first, runs 2..N are warm.
// --decode N      after each run's prefill, N greedy decode steps (one token per llama_decode,
//                 the argmax of the last logits), timed apart from the prefill.
// --json FILE     timings: load, peak RSS, and per run the prefill wall time, tokens/s and
//                 llama's own prompt-eval time, the decode time, and the provider's lookahead
//                 counts (ubatches served from a lookahead read / read by the gather itself, the
//                 time inside the PLE gathers) for the prefill and the decode apart.
// --expect-lookahead  every PLE gather of the first run's prefill and decode must take its rows
//                 from the provider's lookahead read (pleio-provider.patch, PLEIO_LOOKAHEAD).
//
// Exit status: 0 ok, 1 usage or input error, 2 a failed llama call or a failed expectation.

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <sys/resource.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

// [pleio] the provider's lookahead counters (pleio-provider.patch, src/llama-impl.h); all zero
// when pleio does not serve the table
struct llama_ple_lookahead_counts {
    uint64_t prefetched = 0;
    uint64_t direct     = 0;
    uint64_t gather_us  = 0;
};
llama_ple_lookahead_counts llama_ple_lookahead_get_counts();

namespace {

[[noreturn]] void die(int code, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pleio-llama-driver: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}

const char * PLE_TENSOR = "per_layer_token_embd.weight";

enum class gather_kind { none, get_rows, pleio };

const char * kind_name(gather_kind k) {
    switch (k) {
        case gather_kind::get_rows: return "get_rows";
        case gather_kind::pleio:    return "pleio";
        default:                    return "none";
    }
}

// which kind of PLE gather node t is, if any
gather_kind ple_gather_kind(const ggml_tensor * t) {
    if (t->op == GGML_OP_GET_ROWS && t->src[0] && strcmp(t->src[0]->name, PLE_TENSOR) == 0) {
        return gather_kind::get_rows;
    }
    if (t->op == GGML_OP_CUSTOM && strncmp(t->name, "pleio_get_rows(", 15) == 0) {
        return gather_kind::pleio;
    }
    return gather_kind::none;
}

struct capture {
    FILE * ids  = nullptr;
    FILE * rows = nullptr;
    gather_kind kind = gather_kind::none;
    bool active = true; // off after the first run
    bool mixed = false; // more than one kind of node seen
    size_t n_nodes = 0;
    size_t n_ids = 0;
    std::vector<char> buf;
};

bool capture_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto * c = (capture *) user_data;
    const gather_kind k = c->active ? ple_gather_kind(t) : gather_kind::none;
    if (ask) {
        return k != gather_kind::none;
    }
    if (k == gather_kind::none) {
        return true;
    }
    if (c->kind != gather_kind::none && c->kind != k) {
        c->mixed = true;
    }
    c->kind = k;
    c->n_nodes++;

    const ggml_tensor * ids = k == gather_kind::get_rows ? t->src[1] : t->src[0];
    if (ids->type != GGML_TYPE_I32 || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || !ggml_is_contiguous(ids)) {
        die(2, "unexpected PLE gather node %s: ids %s, out %s", t->name, ggml_type_name(ids->type), ggml_type_name(t->type));
    }
    const int64_t n = ggml_nelements(ids);
    if (t->ne[1] != n) {
        die(2, "PLE gather node %s: %" PRId64 " ids but %" PRId64 " rows out", t->name, n, t->ne[1]);
    }
    std::vector<int32_t> idv(n);
    ggml_backend_tensor_get(ids, idv.data(), 0, n * sizeof(int32_t));
    for (int32_t id : idv) {
        fprintf(c->ids, "%" PRId32 "\n", id);
    }
    c->n_ids += n;

    c->buf.resize(ggml_nbytes(t));
    ggml_backend_tensor_get(t, c->buf.data(), 0, c->buf.size());
    if (fwrite(c->buf.data(), 1, c->buf.size(), c->rows) != c->buf.size()) {
        die(2, "writing the captured rows failed");
    }
    return true;
}

std::vector<llama_token> read_tokens(const std::string & path) {
    std::ifstream f(path);
    if (!f) {
        die(1, "cannot open token file %s", path.c_str());
    }
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    for (char & ch : s) {
        if (ch == ',' || ch == '[' || ch == ']') {
            ch = ' ';
        }
    }
    std::istringstream in(s);
    std::vector<llama_token> out;
    long long v;
    while (in >> v) {
        if (v < 0 || v > INT32_MAX) {
            die(1, "%s: token id %lld out of range", path.c_str(), v);
        }
        out.push_back((llama_token) v);
    }
    if (!in.eof()) {
        die(1, "%s: not a list of token ids", path.c_str());
    }
    if (out.empty()) {
        die(1, "%s holds no token ids", path.c_str());
    }
    return out;
}

void quiet_log(ggml_log_level level, const char * text, void * user_data) {
    const bool verbose = *(const bool *) user_data;
    if (verbose || level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

uint32_t parse_u32(const char * opt, const char * v) {
    char * end = nullptr;
    const unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || x == 0 || x > UINT32_MAX) {
        die(1, "%s wants a positive integer, got '%s'", opt, v);
    }
    return (uint32_t) x;
}

// s as a JSON string literal
std::string json_str(const std::string & s) {
    std::string out = "\"";
    for (const unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += (char) ch;
        } else if (ch < 0x20) {
            char esc[8];
            snprintf(esc, sizeof(esc), "\\u%04x", ch);
            out += esc;
        } else {
            out += (char) ch;
        }
    }
    return out + "\"";
}

llama_ple_lookahead_counts counts_since(const llama_ple_lookahead_counts & before) {
    llama_ple_lookahead_counts now = llama_ple_lookahead_get_counts();
    now.prefetched -= before.prefetched;
    now.direct     -= before.direct;
    now.gather_us  -= before.gather_us;
    return now;
}

std::string counts_json(const llama_ple_lookahead_counts & c) {
    char buf[160];
    snprintf(buf, sizeof(buf), "{\"prefetched\": %" PRIu64 ", \"direct\": %" PRIu64 ", \"gather_ms\": %.3f}",
             c.prefetched, c.direct, c.gather_us / 1000.0);
    return buf;
}

struct run_result {
    double wall_ms;
    double p_eval_ms;
    double decode_ms;
    llama_ple_lookahead_counts prefill, decode;
};

} // namespace

int main(int argc, char ** argv) {
    std::string model_path, tokens_path, capture_dir, logits_path, json_path;
    std::string expect_op;
    uint32_t n_ubatch = 64, n_batch = 0, n_threads = 2, n_runs = 1, n_decode = 0;
    bool expect_lookahead = false;
    llama_lazy_mode lazy = LLAMA_LAZY_MODE_ON;
    llama_load_mode load_mode = LLAMA_LOAD_MODE_NONE;
    bool verbose = false;

    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) {
                die(1, "%s needs a value", a.c_str());
            }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") {
            model_path = next();
        } else if (a == "-t" || a == "--tokens") {
            tokens_path = next();
        } else if (a == "--ubatch" || a == "-ub") {
            n_ubatch = parse_u32("--ubatch", next());
        } else if (a == "--batch" || a == "-b") {
            n_batch = parse_u32("--batch", next());
        } else if (a == "--threads") {
            n_threads = parse_u32("--threads", next());
        } else if (a == "--runs") {
            n_runs = parse_u32("--runs", next());
        } else if (a == "--decode") {
            n_decode = parse_u32("--decode", next());
        } else if (a == "--expect-lookahead") {
            expect_lookahead = true;
        } else if (a == "--lazy") {
            const std::string v = next();
            if (v == "on") {
                lazy = LLAMA_LAZY_MODE_ON;
            } else if (v == "auto") {
                lazy = LLAMA_LAZY_MODE_AUTO;
            } else if (v == "off") {
                lazy = LLAMA_LAZY_MODE_OFF;
            } else {
                die(1, "--lazy wants on, auto or off");
            }
        } else if (a == "--load-mode") {
            load_mode = llama_load_mode_from_str(next());
        } else if (a == "--capture") {
            capture_dir = next();
        } else if (a == "--expect-op") {
            expect_op = next();
            if (expect_op != "get_rows" && expect_op != "pleio") {
                die(1, "--expect-op wants get_rows or pleio");
            }
        } else if (a == "--logits") {
            logits_path = next();
        } else if (a == "--json") {
            json_path = next();
        } else if (a == "--verbose" || a == "-v") {
            verbose = true;
        } else {
            die(1, "unknown argument %s (see the comment at the top of driver.cpp)", a.c_str());
        }
    }
    if (model_path.empty() || tokens_path.empty()) {
        die(1, "usage: pleio-llama-driver -m MODEL -t TOKENS [options]");
    }
    if (!expect_op.empty() && capture_dir.empty()) {
        die(1, "--expect-op needs --capture");
    }
    if (n_batch == 0) {
        n_batch = n_ubatch;
    }

    const std::vector<llama_token> tokens = read_tokens(tokens_path);
    const uint32_t n_tokens = (uint32_t) tokens.size();

    llama_log_set(quiet_log, &verbose);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.lazy_mode    = lazy;
    mp.load_mode    = load_mode;
    mp.n_gpu_layers = 0;

    const auto t_load0 = std::chrono::steady_clock::now();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        die(2, "cannot load %s", model_path.c_str());
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (uint32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] >= n_vocab) {
            die(1, "token %u = %d is outside the model's vocabulary (%d)", i, tokens[i], n_vocab);
        }
    }

    capture cap;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_tokens + n_decode;
    cp.n_batch         = n_batch;
    cp.n_ubatch        = n_ubatch;
    cp.n_seq_max       = 1;
    cp.n_threads       = (int32_t) n_threads;
    cp.n_threads_batch = (int32_t) n_threads;
    cp.no_perf         = false;
    if (!capture_dir.empty()) {
        cap.ids  = fopen((capture_dir + "/rows.txt").c_str(), "w");
        cap.rows = fopen((capture_dir + "/rows.f32").c_str(), "wb");
        if (!cap.ids || !cap.rows) {
            die(1, "cannot write into %s", capture_dir.c_str());
        }
        cp.cb_eval           = capture_cb;
        cp.cb_eval_user_data = &cap;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die(2, "cannot create a context");
    }
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load0).count();

    FILE * logits_f = nullptr;
    if (!logits_path.empty()) {
        logits_f = fopen(logits_path.c_str(), "wb");
        if (!logits_f) {
            die(1, "cannot write %s", logits_path.c_str());
        }
    }

    llama_batch batch = llama_batch_init((int32_t) n_batch, 0, 1);
    std::vector<run_result> results;
    size_t n_nonfinite = 0;

    for (uint32_t run = 0; run < n_runs; ++run) {
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_perf_context_reset(ctx);
        // logits and captures come from the first run only
        const bool record = run == 0;
        cap.active = record;
        double wall_ms = 0.0;
        const llama_ple_lookahead_counts c0 = llama_ple_lookahead_get_counts();
        for (uint32_t p0 = 0; p0 < n_tokens; p0 += n_batch) {
            const uint32_t n = std::min(n_batch, n_tokens - p0);
            batch.n_tokens = (int32_t) n;
            for (uint32_t j = 0; j < n; ++j) {
                batch.token[j]     = tokens[p0 + j];
                batch.pos[j]       = (llama_pos) (p0 + j);
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = 0;
                // every position's logits when they are dumped, else the last one only
                batch.logits[j]    = (record && logits_f) || p0 + j == n_tokens - 1;
            }
            const auto t0 = std::chrono::steady_clock::now();
            const int32_t rc = llama_decode(ctx, batch);
            llama_synchronize(ctx); // also books llama's own prompt-eval time
            wall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (rc != 0) {
                die(2, "llama_decode failed (%d) at position %u", rc, p0);
            }
            if (record && logits_f) {
                const float * lg = llama_get_logits(ctx);
                const size_t cnt = (size_t) n * n_vocab;
                for (size_t k = 0; k < cnt; ++k) {
                    n_nonfinite += !std::isfinite(lg[k]);
                }
                if (fwrite(lg, sizeof(float), cnt, logits_f) != cnt) {
                    die(2, "writing %s failed", logits_path.c_str());
                }
            }
        }
        const llama_perf_context_data perf = llama_perf_context(ctx);
        const llama_ple_lookahead_counts prefill = counts_since(c0);

        // greedy decode: the next token is known before its llama_decode starts
        const llama_ple_lookahead_counts c1 = llama_ple_lookahead_get_counts();
        double decode_ms = 0.0;
        for (uint32_t i = 0; i < n_decode; ++i) {
            const float * lg = llama_get_logits_ith(ctx, -1);
            if (!lg) {
                die(2, "no logits for decode step %u", i);
            }
            llama_token next = 0;
            for (int32_t v = 1; v < n_vocab; ++v) {
                next = lg[v] > lg[next] ? v : next;
            }
            batch.n_tokens     = 1;
            batch.token[0]     = next;
            batch.pos[0]       = (llama_pos) (n_tokens + i);
            batch.n_seq_id[0]  = 1;
            batch.seq_id[0][0] = 0;
            batch.logits[0]    = true;
            const auto t0 = std::chrono::steady_clock::now();
            const int32_t rc = llama_decode(ctx, batch);
            llama_synchronize(ctx);
            decode_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (rc != 0) {
                die(2, "llama_decode failed (%d) at decode step %u", rc, i);
            }
            if (record && logits_f) {
                const float * out = llama_get_logits_ith(ctx, -1);
                if (!out || fwrite(out, sizeof(float), (size_t) n_vocab, logits_f) != (size_t) n_vocab) {
                    die(2, "writing %s failed", logits_path.c_str());
                }
            }
        }
        const llama_ple_lookahead_counts decode = counts_since(c1);
        results.push_back({ wall_ms, perf.t_p_eval_ms, decode_ms, prefill, decode });
        fprintf(stderr, "run %u: %u tokens in %.1f ms: %.1f tokens/s (llama prompt eval %.1f ms); "
                "PLE ubatches from lookahead %" PRIu64 ", read directly %" PRIu64 ", gathers %.1f ms\n",
                run + 1, n_tokens, wall_ms, n_tokens / (wall_ms / 1000.0), perf.t_p_eval_ms,
                prefill.prefetched, prefill.direct, prefill.gather_us / 1000.0);
        if (n_decode > 0) {
            fprintf(stderr, "run %u: %u decode steps in %.1f ms (%.2f ms/token); PLE from lookahead %" PRIu64
                    ", read directly %" PRIu64 ", gathers %.1f ms\n", run + 1, n_decode, decode_ms,
                    decode_ms / n_decode, decode.prefetched, decode.direct, decode.gather_us / 1000.0);
        }
    }

    if (logits_f && fclose(logits_f) != 0) {
        die(2, "closing %s failed", logits_path.c_str());
    }
    if (!capture_dir.empty()) {
        if (fclose(cap.ids) != 0 || fclose(cap.rows) != 0) {
            die(2, "closing the capture files failed");
        }
        fprintf(stderr, "captured %zu PLE gather nodes (%s), %zu row ids\n", cap.n_nodes, kind_name(cap.kind), cap.n_ids);
        if (cap.mixed) {
            die(2, "both stock and pleio PLE gather nodes ran");
        }
        if (!expect_op.empty() && expect_op != kind_name(cap.kind)) {
            die(2, "expected the PLE gather to be %s, saw %s", expect_op.c_str(), kind_name(cap.kind));
        }
    }
    if (n_nonfinite) {
        die(2, "%zu logits are not finite", n_nonfinite);
    }
    if (expect_lookahead) {
        const run_result & r = results[0];
        if (r.prefill.prefetched == 0 || r.prefill.direct != 0 || r.decode.direct != 0 ||
            r.decode.prefetched != n_decode) {
            die(2, "expected every PLE gather of run 1 to come from the lookahead: prefill %" PRIu64 " from it, %" PRIu64
                " read directly; decode %" PRIu64 " from it, %" PRIu64 " read directly",
                r.prefill.prefetched, r.prefill.direct, r.decode.prefetched, r.decode.direct);
        }
    }

    struct rusage ru = {};
    getrusage(RUSAGE_SELF, &ru); // ru_maxrss: KiB on Linux

    if (!json_path.empty()) {
        FILE * j = fopen(json_path.c_str(), "w");
        if (!j) {
            die(1, "cannot write %s", json_path.c_str());
        }
        fprintf(j, "{\"model\": %s, \"tokens\": %u, \"ubatch\": %u, \"batch\": %u, \"threads\": %u, \"decode\": %u, "
                "\"load_ms\": %.3f, \"max_rss_kib\": %ld, \"runs\": [",
                json_str(model_path).c_str(), n_tokens, n_ubatch, n_batch, n_threads, n_decode, load_ms, ru.ru_maxrss);
        for (size_t r = 0; r < results.size(); ++r) {
            const run_result & x = results[r];
            fprintf(j, "%s{\"wall_ms\": %.3f, \"tokens_per_s\": %.3f, \"p_eval_ms\": %.3f, \"decode_ms\": %.3f, "
                    "\"lookahead_prefill\": %s, \"lookahead_decode\": %s}", r ? ", " : "",
                    x.wall_ms, n_tokens / (x.wall_ms / 1000.0), x.p_eval_ms, x.decode_ms,
                    counts_json(x.prefill).c_str(), counts_json(x.decode).c_str());
        }
        fprintf(j, "]}\n");
        if (fclose(j) != 0) {
            die(2, "closing %s failed", json_path.c_str());
        }
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
