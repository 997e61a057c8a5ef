/*
 * pleio's decoders against ggml's own, in one process: the same stored
 * blocks decoded to f32 by ggml's CPU path and by pleio_decode, compared
 * bit for bit and timed alternately.
 *
 *   decode_vs_ggml [--rounds N] [--rows N] [--types A,B,...] [--json FILE]
 *
 * (--types: ggml's type names, any case: IQ4_NL,Q8_0,BF16)
 *
 * ggml's side is what its CPU get_rows runs: the type's `to_float` (from
 * ggml-base, ggml-quants.c) for quantized types, `ggml_cpu_fp16_to_fp32`
 * and `ggml_cpu_bf16_to_fp32` (ggml-cpu, SIMD) for F16 and BF16. Blocks
 * are made by ggml_quantize_chunk from seeded random floats (with an
 * importance matrix of ones where the type needs one), --rows rows (8192:
 * a prefill ubatch) of 160 elements for types of 32-element blocks, 256
 * for the rest. Each side decodes the whole ubatch in one call.
 *
 * Every type that both decode is checked (any bit of difference is an
 * error naming the type and the element; exit 1); --rounds 0 checks only.
 * Each round times both sides once and, as the floor of any decode to f32,
 * a memset of the output's bytes (the stores alone), in rotating order.
 * Prints one line per type and, with --json, a report: per type the median
 * and fastest ms of each side and the floor's median; ggml / pleio above 1
 * means pleio is faster.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml-cpu.h"
#include "ggml.h"
#include "pleio.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void die(const char *what) {
    fprintf(stderr, "decode_vs_ggml: %s\n", what);
    exit(2);
}

static void *must_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) die("out of memory");
    return p;
}

/* A seeded xorshift and a roughly normal float from it. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float normalish(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        s += (float)(rng >> 40) / (float)(1 << 24);
    }
    return (s - 2.0f) * 1.7f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ggml's CPU get_rows conversion of `k` elements of `type`. */
static void ggml_decode(enum ggml_type type, const void *src, float *dst, int64_t k) {
    if (type == GGML_TYPE_F16) {
        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *)src, dst, k);
    } else if (type == GGML_TYPE_BF16) {
        ggml_cpu_bf16_to_fp32((const ggml_bf16_t *)src, dst, k);
    } else {
        ggml_get_type_traits(type)->to_float(src, dst, k);
    }
}

static int wanted(const char *list, const char *name) {
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncasecmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int rounds = 41, rows = 8192;
    const char *types = NULL, *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0) rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rows") == 0) rows = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--types") == 0) types = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--json") == 0) json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--rows N] [--types A,B] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 0 || rows < 1) die("--rounds must be >= 0 and --rows >= 1");
    ggml_cpu_init();

    FILE *out = NULL;
    if (json) {
        out = fopen(json, "w");
        if (!out) die("cannot write the --json file");
        fprintf(out, "{\"rows\": %d, \"rounds\": %d, \"types\": [", rows, rounds);
    }
    double *tp = must_alloc(sizeof(double) * (size_t)(rounds ? rounds : 1));
    double *tg = must_alloc(sizeof(double) * (size_t)(rounds ? rounds : 1));
    double *tf = must_alloc(sizeof(double) * (size_t)(rounds ? rounds : 1));
    int checked = 0, bad = 0, first = 1;
    printf("%-8s %5s %12s %12s %12s %12s %9s %12s\n", "type", "elems", "pleio med", "ggml med", "pleio best",
           "ggml best", "ggml/pleio", "store floor");
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        enum ggml_type type = (enum ggml_type)t;
        const struct ggml_type_traits *tr = ggml_get_type_traits(type);
        if (!tr || !tr->type_name || tr->blck_size == 0 || type == GGML_TYPE_F32) continue;
        if (!tr->to_float && type != GGML_TYPE_F16 && type != GGML_TYPE_BF16) continue;
        if (!wanted(types, tr->type_name)) continue;
        const int64_t per_row = tr->blck_size <= 32 ? 160 : 256;
        if (per_row % tr->blck_size) continue;
        const int64_t n = per_row * rows;
        const size_t bytes = ggml_row_size(type, per_row) * (size_t)rows;

        /* does pleio decode this type? (one block, into room for it) */
        float probe[256];
        unsigned char zero[512] = {0};
        if (ggml_row_size(type, tr->blck_size) > sizeof zero || tr->blck_size > 256) continue;
        int rc = pleio_decode((uint32_t)t, zero, ggml_row_size(type, tr->blck_size), PLEIO_DTYPE_F32, probe,
                              sizeof probe, NULL);
        if (rc == PLEIO_ERR_UNSUPPORTED) continue;

        float *x = must_alloc((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) x[i] = normalish();
        float *imatrix = NULL;
        if (ggml_quantize_requires_imatrix(type)) {
            imatrix = must_alloc((size_t)per_row * sizeof(float));
            for (int64_t i = 0; i < per_row; i++) imatrix[i] = 1.0f;
        }
        void *blocks = must_alloc(bytes);
        if (ggml_quantize_chunk(type, x, blocks, 0, rows, per_row, imatrix) != bytes) die("ggml_quantize_chunk");
        float *a = must_alloc((size_t)n * sizeof(float));
        float *b = must_alloc((size_t)n * sizeof(float));

        size_t elems = 0;
        rc = pleio_decode((uint32_t)t, blocks, bytes, PLEIO_DTYPE_F32, a, (size_t)n * sizeof(float), &elems);
        if (rc != PLEIO_OK || elems != (size_t)n) {
            fprintf(stderr, "%s: pleio_decode failed (%d): %s\n", tr->type_name, rc, pleio_last_error());
            return 1;
        }
        ggml_decode(type, blocks, b, n);
        checked++;
        if (memcmp(a, b, (size_t)n * sizeof(float)) != 0) {
            for (int64_t i = 0; i < n; i++) {
                uint32_t ua, ub;
                memcpy(&ua, &a[i], 4);
                memcpy(&ub, &b[i], 4);
                if (ua != ub) {
                    fprintf(stderr, "%s: element %lld (row %lld) differs: pleio %08x (%g), ggml %08x (%g)\n",
                            tr->type_name, (long long)i, (long long)(i / per_row), ua, (double)a[i], ub,
                            (double)b[i]);
                    break;
                }
            }
            bad++;
        }

        for (int r = 0; r < rounds; r++) {
            for (int k = 0; k < 3; k++) {
                /* 0 pleio, 1 ggml, 2 the store floor; all into the same buffer, so each
                 * finds it as warm as the one before left it */
                int side = (k + r) % 3;
                double t0 = now_ms();
                if (side == 0) {
                    pleio_decode((uint32_t)t, blocks, bytes, PLEIO_DTYPE_F32, a, (size_t)n * sizeof(float), NULL);
                } else if (side == 1) {
                    ggml_decode(type, blocks, a, n);
                } else {
                    memset(a, r & 0xff, (size_t)n * sizeof(float));
                }
                __asm__ volatile("" : : "r"(a), "r"(b) : "memory");
                double dt = now_ms() - t0;
                (side == 0 ? tp : side == 1 ? tg : tf)[r] = dt;
            }
        }
        if (rounds > 0) {
            double bp = tp[0], bg = tg[0];
            for (int r = 1; r < rounds; r++) {
                bp = fmin(bp, tp[r]);
                bg = fmin(bg, tg[r]);
            }
            double mp = median(tp, rounds), mg = median(tg, rounds), mf = median(tf, rounds);
            printf("%-8s %5lld %9.3f ms %9.3f ms %9.3f ms %9.3f ms %8.2fx %9.3f ms\n", tr->type_name,
                   (long long)per_row, mp, mg, bp, bg, mg / mp, mf);
            if (out) {
                fprintf(out,
                        "%s\n  {\"type\": \"%s\", \"row_elems\": %lld, \"ggml\": \"%s\", \"pleio_median_ms\": %.5f, "
                        "\"ggml_median_ms\": %.5f, \"pleio_best_ms\": %.5f, \"ggml_best_ms\": %.5f, "
                        "\"store_floor_median_ms\": %.5f}",
                        first ? "" : ",", tr->type_name, (long long)per_row,
                        type == GGML_TYPE_F16    ? "ggml_cpu_fp16_to_fp32"
                        : type == GGML_TYPE_BF16 ? "ggml_cpu_bf16_to_fp32"
                                                 : "to_float",
                        mp, mg, bp, bg, mf);
                first = 0;
            }
        }
        free(x);
        free(imatrix);
        free(blocks);
        free(a);
        free(b);
    }
    if (out) {
        fprintf(out, "\n], \"checked\": %d, \"differing\": %d}\n", checked, bad);
        fclose(out);
    }
    printf("%d types checked bit for bit against ggml, %d differ\n", checked, bad);
    free(tp);
    free(tg);
    free(tf);
    ggml_quantize_free();
    return bad ? 1 : (checked ? 0 : 1);
}
