/*
 * The C ABI against the pleio CLI, built by scripts/capi_test.sh with the
 * system C compiler under -fsanitize=address,undefined and linked to
 * libpleio_capi.a.
 *
 *   capi_test DIR
 *
 * DIR (written by the script) holds q.gguf (a synthetic qwen4exp table),
 * g.gguf (gemma4), meta.txt ("rows row_elems row_bytes type_name"),
 * ids.txt, the CLI's rows of those ids as expect.{f32,bf16,f16,raw},
 * tokens.txt with `pleio rows`' ids for them in rows.txt, and bad.gguf
 * (not a GGUF file). Prints one line per failed check and
 * "N passed, M failed"; exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include "pleio.h"

#include <dirent.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            passed++;                                                           \
        } else {                                                                \
            failed++;                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", pleio_last_error());         \
        }                                                                       \
    } while (0)

static char dir[4096];

static const char *at(const char *name) {
    static char buf[4][4200];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static void *slurp(const char *name, size_t *len) {
    FILE *f = fopen(at(name), "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", at(name));
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", at(name));
        exit(2);
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Whitespace-separated integers of a file. */
static int64_t *ints(const char *name, size_t *n) {
    FILE *f = fopen(at(name), "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", at(name));
        exit(2);
    }
    size_t cap = 1024;
    int64_t *v = malloc(cap * sizeof *v);
    long long x;
    *n = 0;
    while (fscanf(f, "%lld", &x) == 1) {
        if (*n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[(*n)++] = (int64_t)x;
    }
    fclose(f);
    return v;
}

static int all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != b) return 0;
    return 1;
}

static int mentions(const char *text, const char *what) { return strstr(text, what) != NULL; }

static void *thread_last_error(void *arg) {
    (void)arg;
    /* A fresh thread has no last error, whatever failed elsewhere. */
    return (void *)(uintptr_t)(pleio_last_error()[0] == '\0');
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);

    unsigned long long rows, row_elems, row_bytes;
    char type_name[64];
    FILE *mf = fopen(at("meta.txt"), "r");
    if (!mf || fscanf(mf, "%llu %llu %llu %63s", &rows, &row_elems, &row_bytes, type_name) != 4) {
        fprintf(stderr, "cannot read meta.txt\n");
        return 2;
    }
    fclose(mf);

    size_t n, n_tokens, n_rows_expected;
    int64_t *ids = ints("ids.txt", &n);
    int64_t *tokens64 = ints("tokens.txt", &n_tokens);
    int64_t *rows_expected = ints("rows.txt", &n_rows_expected);
    int32_t *ids32 = malloc(n * sizeof *ids32);
    for (size_t i = 0; i < n; i++) ids32[i] = (int32_t)ids[i];
    int32_t *tokens = malloc(n_tokens * sizeof *tokens);
    for (size_t i = 0; i < n_tokens; i++) tokens[i] = (int32_t)tokens64[i];

    struct {
        pleio_dtype dtype;
        const char *file;
        size_t bytes;
    } kinds[] = {
        {PLEIO_DTYPE_F32, "expect.f32", n * row_elems * 4},
        {PLEIO_DTYPE_BF16, "expect.bf16", n * row_elems * 2},
        {PLEIO_DTYPE_F16, "expect.f16", n * row_elems * 2},
        {PLEIO_DTYPE_RAW, "expect.raw", n * row_bytes},
    };

    CHECK(strlen(pleio_version()) > 0, "version");
    CHECK(pleio_last_error()[0] == '\0', "no error yet");

    /* --- opening --- */
    pleio_table *t = NULL;
    CHECK(pleio_open(NULL, NULL, &t) == PLEIO_ERR_ARGUMENT && t == NULL, "NULL path");
    CHECK(mentions(pleio_last_error(), "path"), "message names the path argument");
    CHECK(pleio_open(at("q.gguf"), NULL, NULL) == PLEIO_ERR_ARGUMENT, "NULL out");
    CHECK(pleio_open(at("missing.gguf"), NULL, &t) == PLEIO_ERR_NOT_FOUND && t == NULL, "missing file");
    CHECK(mentions(pleio_last_error(), "missing.gguf"), "message names the file");
    CHECK(pleio_open(at("bad.gguf"), NULL, &t) == PLEIO_ERR_INVALID_FILE, "not a GGUF file");
    CHECK(mentions(pleio_last_error(), "bad.gguf"), "message names the file");
    CHECK(pleio_open(at("q.gguf"), "no_such.weight", &t) == PLEIO_ERR_NO_TABLE, "no such tensor");
    CHECK(mentions(pleio_last_error(), "no_such.weight"), "message names the tensor");
    CHECK(pleio_open_with(at("q.gguf"), NULL, "warp-drive", &t) == PLEIO_ERR_ARGUMENT, "bad strategy");
    CHECK(pleio_open(at("q.gguf"), NULL, &t) == PLEIO_OK && t != NULL, "open");

    pleio_info info;
    memset(&info, 0, sizeof info);
    CHECK(pleio_table_info(t, &info) == PLEIO_OK, "info");
    CHECK(info.rows == rows && info.row_elems == row_elems && info.row_bytes == row_bytes,
          "geometry %llu %llu %llu", (unsigned long long)info.rows,
          (unsigned long long)info.row_elems, (unsigned long long)info.row_bytes);
    CHECK(strcmp(info.type_name, type_name) == 0, "type %s", info.type_name);
    CHECK(strcmp(info.tensor, "per_layer_token_embd.weight") == 0, "tensor %s", info.tensor);
    CHECK(mentions(info.path, "q.gguf"), "path %s", info.path);
    CHECK(strcmp(info.strategy, "auto") == 0, "strategy %s", info.strategy);
    CHECK(strcmp(info.architecture, "qwen4exp") == 0, "arch %s", info.architecture);
    CHECK(info.rows_per_token == n_rows_expected / n_tokens, "rows per token %llu",
          (unsigned long long)info.rows_per_token);
    CHECK(pleio_table_info(t, NULL) == PLEIO_ERR_ARGUMENT, "NULL info");

    /* --- gathering every dtype, int64 and int32 ids, bit for bit --- */
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t len;
        void *expect = slurp(kinds[k].file, &len);
        CHECK(len == kinds[k].bytes, "%s holds %zu bytes", kinds[k].file, len);
        size_t need = 0;
        CHECK(pleio_out_bytes(t, kinds[k].dtype, n, &need) == PLEIO_OK && need == len, "out_bytes %zu", need);

        /* one spare byte each side, to see that nothing else is written */
        unsigned char *buf = malloc(len + 2);
        memset(buf, 0xAB, len + 2);
        pleio_stats st;
        memset(&st, 0, sizeof st);
        CHECK(pleio_gather(t, ids, n, kinds[k].dtype, buf + 1, len, &st) == PLEIO_OK, "gather %s", kinds[k].file);
        CHECK(memcmp(buf + 1, expect, len) == 0, "%s: pleio_gather equals the CLI", kinds[k].file);
        CHECK(buf[0] == 0xAB && buf[len + 1] == 0xAB, "nothing outside out");
        CHECK(st.rows == n && st.bytes == n * row_bytes, "stats rows %llu", (unsigned long long)st.rows);
        CHECK(st.pages == -1 && st.major_faults == -1, "unmeasured stats are -1");

        memset(buf, 0xAB, len + 2);
        CHECK(pleio_gather_i32(t, ids32, n, kinds[k].dtype, buf, len + 2, NULL) == PLEIO_OK, "gather_i32");
        CHECK(memcmp(buf, expect, len) == 0, "%s: pleio_gather_i32 equals the CLI", kinds[k].file);
        CHECK(buf[len] == 0xAB && buf[len + 1] == 0xAB, "only the needed bytes of a larger out are written");

        /* a short buffer: an error, nothing written */
        memset(buf, 0xAB, len + 2);
        CHECK(pleio_gather(t, ids, n, kinds[k].dtype, buf, len - 1, NULL) == PLEIO_ERR_OUTPUT_SIZE, "short out");
        CHECK(all_bytes(buf, len + 2, 0xAB), "nothing written on a short out");
        free(buf);
        free(expect);
    }

    /* --- the machine-wide shared cache: the same bytes; the second gather
       reads nothing from the device (every row a hit in the segment) --- */
    {
        pleio_table *sh = NULL;
        CHECK(pleio_open_with(at("q.gguf"), NULL, "shared", &sh) == PLEIO_OK && sh != NULL, "open shared");
        size_t len;
        void *expect = slurp("expect.f32", &len);
        void *buf = malloc(len);
        pleio_stats st;
        for (int pass = 0; pass < 2; pass++) {
            memset(buf, 0xAB, len);
            memset(&st, 0, sizeof st);
            CHECK(pleio_gather(sh, ids, n, PLEIO_DTYPE_F32, buf, len, &st) == PLEIO_OK, "shared gather");
            CHECK(memcmp(buf, expect, len) == 0, "shared (pass %d): pleio_gather equals the CLI", pass);
        }
        CHECK(st.fallback == 0, "fallback %u", st.fallback);
        CHECK(st.read_requests == 0, "second shared gather: %llu reads", (unsigned long long)st.read_requests);
        pleio_close(sh);

        /* the budget, through pleio_open_ex: the segment this process makes
           (in a private PLEIO_SHM_DIR) is sized for it */
        char dir[] = "/dev/shm/pleio-capi-XXXXXX";
        CHECK(mkdtemp(dir) != NULL, "mkdtemp under /dev/shm");
        setenv("PLEIO_SHM_DIR", dir, 1);
        pleio_open_options o;
        memset(&o, 0, sizeof o);
        o.size = sizeof o;
        o.layer = -1;
        o.strategy = "shared";
        o.budget = 4u << 20;
        CHECK(pleio_open_ex(at("q.gguf"), &o, &sh) == PLEIO_OK, "open_ex shared, 4 MiB: %s", pleio_last_error());
        CHECK(pleio_gather(sh, ids, n, PLEIO_DTYPE_F32, buf, len, NULL) == PLEIO_OK &&
                  memcmp(buf, expect, len) == 0,
              "shared with a 4 MiB budget: pleio_gather equals the CLI");
        long long seg_bytes = -1;
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, "pleio-", 6) == 0) {
                char p[512];
                struct stat sb;
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                if (stat(p, &sb) == 0) seg_bytes = (long long)sb.st_size;
            }
        }
        if (d) closedir(d);
        CHECK(seg_bytes > (2 << 20) && seg_bytes <= (4 << 20), "segment of %lld bytes for a 4 MiB budget", seg_bytes);
        pleio_close(sh);
        o.budget = 1;
        pleio_table *tiny = NULL;
        CHECK(pleio_open_ex(at("q.gguf"), &o, &tiny) != PLEIO_OK && tiny == NULL, "a 1-byte budget fails");
        CHECK(mentions(pleio_last_error(), "budget"), "message names the budget: %s", pleio_last_error());
        /* a caller built before `budget` was added: the default budget */
        o.size = offsetof(pleio_open_options, budget);
        CHECK(pleio_open_ex(at("q.gguf"), &o, &sh) == PLEIO_OK, "open_ex with the older struct: %s", pleio_last_error());
        pleio_close(sh);
        unsetenv("PLEIO_SHM_DIR");
        rmdir(dir);
        free(buf);
        free(expect);
    }

    /* --- bad arguments: errors, nothing written, never a crash --- */
    size_t one = row_elems * 4;
    float *row = malloc(one);
    pleio_stats st;
    memset(row, 0xAB, one);
    memset(&st, 0xAB, sizeof st);
    int64_t past = (int64_t)rows;
    CHECK(pleio_gather(t, &past, 1, PLEIO_DTYPE_F32, row, one, &st) == PLEIO_ERR_ROW_OUT_OF_RANGE, "id == rows");
    char want[64];
    snprintf(want, sizeof want, "%llu", rows);
    CHECK(mentions(pleio_last_error(), want), "message names the limit");
    CHECK(all_bytes(row, one, 0xAB) && all_bytes(&st, sizeof st, 0xAB), "nothing written");
    int32_t neg = -5;
    CHECK(pleio_gather_i32(t, &neg, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_ROW_OUT_OF_RANGE, "negative id");
    CHECK(mentions(pleio_last_error(), "-5"), "message names the id");
    int64_t mixed[3] = {0, 1, -1};
    float *three = malloc(3 * one);
    memset(three, 0xAB, 3 * one);
    CHECK(pleio_gather(t, mixed, 3, PLEIO_DTYPE_F32, three, 3 * one, NULL) == PLEIO_ERR_ROW_OUT_OF_RANGE, "a bad id last");
    CHECK(all_bytes(three, 3 * one, 0xAB), "no row written when a later id is bad");
    free(three);
    CHECK(pleio_gather(t, NULL, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_ARGUMENT, "NULL ids");
    CHECK(pleio_gather(t, ids, 1, PLEIO_DTYPE_F32, NULL, one, NULL) == PLEIO_ERR_ARGUMENT, "NULL out");
    CHECK(pleio_gather(t, ids, 1, (pleio_dtype)7, row, one, NULL) == PLEIO_ERR_ARGUMENT, "dtype 7");
    CHECK(pleio_gather(t, ids, 1, (pleio_dtype)-1, row, one, NULL) == PLEIO_ERR_ARGUMENT, "dtype -1");
    CHECK(mentions(pleio_last_error(), "dtype"), "message names the dtype");
    CHECK(pleio_gather(t, (const int64_t *)((char *)ids + 1), 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_ARGUMENT,
          "misaligned ids");
    CHECK(pleio_gather(t, (const int64_t *)row, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_ARGUMENT,
          "ids overlapping out");
    CHECK(pleio_gather(t, NULL, 0, PLEIO_DTYPE_F32, NULL, 0, NULL) == PLEIO_OK, "zero rows is a no-op");
    CHECK(pleio_gather(NULL, ids, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_HANDLE, "NULL table");
    CHECK(pleio_gather((pleio_table *)&past, ids, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_HANDLE,
          "a pointer that is no handle");
    CHECK(all_bytes(row, one, 0xAB), "nothing written by any of them");

    /* unaligned f32 output is allowed (decoded through bytes) */
    {
        size_t len;
        float *expect = slurp("expect.f32", &len);
        unsigned char *odd = malloc(one + 1);
        CHECK(pleio_gather(t, ids, 1, PLEIO_DTYPE_F32, odd + 1, one, NULL) == PLEIO_OK, "unaligned f32 out");
        CHECK(memcmp(odd + 1, expect, one) == 0, "unaligned f32 out equals the CLI");
        free(odd);
        free(expect);
    }

    /* the last error is per thread */
    pthread_t th;
    void *fresh = NULL;
    pthread_create(&th, NULL, thread_last_error, NULL);
    pthread_join(th, &fresh);
    CHECK(fresh != NULL, "a new thread has no last error");

    /* --- prefetch / wait --- */
    {
        size_t len;
        float *expect = slurp("expect.f32", &len);
        float *got = malloc(len);
        pleio_batch *p = NULL, *q = NULL;
        CHECK(pleio_prefetch(t, ids, n, &p) == PLEIO_OK && p != NULL, "prefetch");
        CHECK(pleio_prefetch_i32(t, ids32, n, &q) == PLEIO_OK && q != NULL, "prefetch_i32");
        memset(&st, 0, sizeof st);
        CHECK(pleio_wait(p, got, len, &st) == PLEIO_OK, "wait");
        CHECK(memcmp(got, expect, len) == 0, "prefetched rows equal the CLI");
        CHECK(st.rows == n, "prefetch stats");
        CHECK(pleio_wait(p, got, len, NULL) == PLEIO_ERR_HANDLE, "a prefetch is waited for once");
        memset(got, 0, len);
        CHECK(pleio_wait(q, got, len, NULL) == PLEIO_OK && memcmp(got, expect, len) == 0, "prefetch_i32 rows");

        pleio_batch *r = NULL;
        CHECK(pleio_prefetch(t, &past, 1, &r) == PLEIO_ERR_ROW_OUT_OF_RANGE && r == NULL, "prefetch checks ids");
        CHECK(pleio_prefetch(t, ids, n, &r) == PLEIO_OK, "prefetch again");
        memset(got, 0xAB, len);
        CHECK(pleio_wait(r, got, len - 4, NULL) == PLEIO_ERR_OUTPUT_SIZE, "wait into a short out");
        CHECK(all_bytes(got, len, 0xAB), "nothing written");
        CHECK(pleio_wait(r, got, len, NULL) == PLEIO_ERR_HANDLE, "the failed wait ended the handle");
        CHECK(pleio_prefetch(t, ids, n, &r) == PLEIO_OK, "prefetch to cancel");
        pleio_prefetch_cancel(r);
        pleio_prefetch_cancel(r);
        pleio_prefetch_cancel(NULL);
        CHECK(pleio_wait(NULL, got, len, NULL) == PLEIO_ERR_HANDLE, "wait on NULL");
        CHECK(pleio_wait((pleio_batch *)t, got, len, NULL) == PLEIO_ERR_HANDLE, "a table is no prefetch");
        free(got);
        free(expect);
    }

    /* --- row ids: pleio_sequence_* equals `pleio rows` --- */
    {
        pleio_sequence *s = NULL;
        CHECK(pleio_sequence_new(t, &s) == PLEIO_OK && s != NULL, "sequence");
        int64_t *got = malloc(n_rows_expected * sizeof *got);
        size_t done = 0, written = 0;
        /* in three uneven batches: history carries across calls */
        size_t cuts[4] = {0, n_tokens / 3, n_tokens / 3 + 1, n_tokens};
        for (int b = 0; b < 3; b++) {
            size_t m = cuts[b + 1] - cuts[b];
            CHECK(pleio_sequence_map(s, tokens + cuts[b], m, got + done, n_rows_expected - done, &written) == PLEIO_OK,
                  "map batch %d", b);
            done += written;
        }
        CHECK(done == n_rows_expected, "row ids %zu", done);
        CHECK(memcmp(got, rows_expected, n_rows_expected * sizeof *got) == 0, "row ids equal `pleio rows`");

        /* reset: the same stream again gives the same ids */
        CHECK(pleio_sequence_reset(s) == PLEIO_OK, "reset");
        memset(got, 0, n_rows_expected * sizeof *got);
        CHECK(pleio_sequence_map(s, tokens, n_tokens, got, n_rows_expected, NULL) == PLEIO_OK, "map all");
        CHECK(memcmp(got, rows_expected, n_rows_expected * sizeof *got) == 0, "after reset: equal again");

        /* the ids gather */
        float *rowsbuf = malloc(info.rows_per_token * one);
        CHECK(pleio_gather(t, got, info.rows_per_token, PLEIO_DTYPE_F32, rowsbuf, info.rows_per_token * one, NULL) ==
                  PLEIO_OK,
              "gather a token's rows");
        free(rowsbuf);

        int32_t bad_token = -1;
        CHECK(pleio_sequence_map(s, &bad_token, 1, got, n_rows_expected, NULL) == PLEIO_ERR_ARGUMENT, "negative token");
        CHECK(pleio_sequence_map(s, tokens, 2, got, 2 * info.rows_per_token - 1, NULL) == PLEIO_ERR_OUTPUT_SIZE,
              "short rows_cap");
        CHECK(pleio_sequence_map(s, NULL, 2, got, n_rows_expected, NULL) == PLEIO_ERR_ARGUMENT, "NULL tokens");
        {
            /* the count inside the ids it counts: refused, nothing written */
            int64_t *mine = calloc(2 * info.rows_per_token, sizeof(int64_t));
            CHECK(pleio_sequence_map(s, tokens, 2, mine, 2 * info.rows_per_token, (size_t *)(mine + 1)) ==
                      PLEIO_ERR_ARGUMENT,
                  "rows_written inside rows");
            int untouched = 1;
            for (uint64_t k = 0; k < 2 * info.rows_per_token; k++) untouched &= mine[k] == 0;
            CHECK(untouched && mentions(pleio_last_error(), "rows_written"), "rows_written: nothing written");
            free(mine);
        }
        CHECK(pleio_sequence_new(t, NULL) == PLEIO_ERR_ARGUMENT, "NULL out");
        pleio_sequence_free(s);
        pleio_sequence_free(s);
        pleio_sequence_free(NULL);
        CHECK(pleio_sequence_reset(s) == PLEIO_ERR_HANDLE, "freed sequence");
        CHECK(pleio_sequence_reset((pleio_sequence *)t) == PLEIO_ERR_HANDLE, "a table is no sequence");
        free(got);
    }

    /* gemma4: the token is the row */
    {
        pleio_table *g = NULL;
        pleio_sequence *s = NULL;
        CHECK(pleio_open(at("g.gguf"), NULL, &g) == PLEIO_OK, "open gemma4");
        pleio_info gi;
        CHECK(pleio_table_info(g, &gi) == PLEIO_OK && gi.rows_per_token == 1 && strcmp(gi.architecture, "gemma4") == 0,
              "gemma4 info");
        CHECK(pleio_sequence_new(g, &s) == PLEIO_OK, "gemma4 sequence");
        int32_t toks[3] = {0, 7, (int32_t)gi.rows - 1};
        int64_t out[3] = {-1, -1, -1};
        CHECK(pleio_sequence_map(s, toks, 3, out, 3, NULL) == PLEIO_OK && out[0] == 0 && out[1] == 7 &&
                  out[2] == (int64_t)gi.rows - 1,
              "identity");
        int32_t past_table = (int32_t)gi.rows;
        CHECK(pleio_sequence_map(s, &past_table, 1, out, 3, NULL) == PLEIO_ERR_ROW_IDS, "token outside the table");
        pleio_sequence_free(s);
        pleio_close(g);
    }

    /* a safetensors checkpoint (MLX 4-bit, three parts a row over three files):
       every dtype equals `pleio gather` of the same directory */
    {
        pleio_table *c = NULL;
        CHECK(pleio_open(at("ck"), NULL, &c) == PLEIO_OK, "open a checkpoint directory");
        pleio_info ci;
        CHECK(pleio_table_info(c, &ci) == PLEIO_OK && ci.row_elems == 160 && ci.row_bytes == 100 &&
                  strcmp(ci.type_name, "mlx4") == 0 && ci.ggml_type == UINT32_MAX,
              "checkpoint info: %s", ci.type_name);
        size_t cn = 0;
        int64_t *cids = ints("ck_ids.txt", &cn);
        const struct { pleio_dtype dtype; const char *file; size_t bytes; } ck[] = {
            {PLEIO_DTYPE_F32, "ck_expect.f32", cn * 160 * 4},
            {PLEIO_DTYPE_BF16, "ck_expect.bf16", cn * 160 * 2},
            {PLEIO_DTYPE_RAW, "ck_expect.raw", cn * 100},
        };
        for (size_t k = 0; k < sizeof ck / sizeof ck[0]; k++) {
            size_t len = 0;
            void *expect = slurp(ck[k].file, &len);
            CHECK(len == ck[k].bytes, "%s holds %zu bytes", ck[k].file, len);
            void *got = malloc(len);
            CHECK(pleio_gather(c, cids, cn, ck[k].dtype, got, len, NULL) == PLEIO_OK, "gather %s", ck[k].file);
            CHECK(memcmp(got, expect, len) == 0, "%s: the checkpoint's rows equal the CLI", ck[k].file);
            free(got);
            free(expect);
        }
        int64_t past = (int64_t)ci.rows;
        float one_row[160];
        CHECK(pleio_gather(c, &past, 1, PLEIO_DTYPE_F32, one_row, sizeof one_row, NULL) ==
                  PLEIO_ERR_ROW_OUT_OF_RANGE,
              "checkpoint row past the table");
        free(cids);
        pleio_close(c);
    }

    /* pleio_open_ex: options, vLLM's rounding on an FP8 checkpoint with an
       F32 scale equals `pleio gather --rounding vllm`, bad options */
    {
        size_t cn = 0;
        int64_t *cids = ints("ck_ids.txt", &cn);
        size_t len = 0, elen = 0;
        void *expect = slurp("fp8_vllm.bf16", &len);
        void *exact = slurp("fp8_exact.bf16", &elen);
        CHECK(len == cn * 160 * 2 && elen == len, "fp8_vllm.bf16 holds %zu bytes", len);
        CHECK(memcmp(expect, exact, len) != 0, "the vllm rule changes some bf16 rows");
        pleio_open_options o;
        memset(&o, 0, sizeof o);
        o.size = sizeof o;
        o.layer = -1;
        o.rounding = "vllm";
        o.strategy = "pread";
        pleio_table *v = NULL;
        CHECK(pleio_open_ex(at("fp8"), &o, &v) == PLEIO_OK && v != NULL, "open_ex vllm: %s", pleio_last_error());
        void *got = malloc(len);
        CHECK(pleio_gather(v, cids, cn, PLEIO_DTYPE_BF16, got, len, NULL) == PLEIO_OK, "gather vllm bf16");
        CHECK(memcmp(got, expect, len) == 0, "open_ex rounding=vllm bf16 equals pleio gather --rounding vllm");
        pleio_info vi;
        CHECK(pleio_table_info(v, &vi) == PLEIO_OK && strcmp(vi.strategy, "pread") == 0, "open_ex strategy");
        pleio_close(v);
        o.rounding = "sglang";
        o.strategy = NULL;
        CHECK(pleio_open_ex(at("fp8"), &o, &v) == PLEIO_OK, "open_ex sglang");
        memset(got, 0, len);
        CHECK(pleio_gather(v, cids, cn, PLEIO_DTYPE_BF16, got, len, NULL) == PLEIO_OK &&
                  memcmp(got, expect, len) == 0,
              "sglang is vllm's rule");
        pleio_close(v);
        /* NULL options and NULL fields: the defaults (exact) */
        CHECK(pleio_open_ex(at("fp8"), NULL, &v) == PLEIO_OK, "open_ex NULL options");
        CHECK(pleio_gather(v, cids, cn, PLEIO_DTYPE_BF16, got, len, NULL) == PLEIO_OK &&
                  memcmp(got, exact, len) == 0,
              "default rounding is exact");
        pleio_close(v);
        free(got);
        free(expect);
        free(exact);
        free(cids);

        pleio_table *bad = NULL;
        o.rounding = "banker";
        CHECK(pleio_open_ex(at("fp8"), &o, &bad) == PLEIO_ERR_ARGUMENT && bad == NULL, "unknown rounding");
        CHECK(mentions(pleio_last_error(), "banker") && mentions(pleio_last_error(), "vllm"),
              "message names the rule and the known ones: %s", pleio_last_error());
        o.rounding = "mlx";
        CHECK(pleio_open_ex(at("fp8"), &o, &bad) == PLEIO_ERR_UNSUPPORTED && bad == NULL, "mlx on FP8");
        CHECK(mentions(pleio_last_error(), "mlx"), "message names the rule: %s", pleio_last_error());
        o.rounding = "vllm";
        CHECK(pleio_open_ex(at("q.gguf"), &o, &bad) == PLEIO_ERR_UNSUPPORTED && bad == NULL, "vllm on GGUF");
        o.rounding = NULL;
        o.size = sizeof o + 8;
        CHECK(pleio_open_ex(at("fp8"), &o, &bad) == PLEIO_ERR_ARGUMENT && bad == NULL, "size too big");
        CHECK(mentions(pleio_last_error(), "size"), "message names size: %s", pleio_last_error());
        o.size = 8;
        CHECK(pleio_open_ex(at("fp8"), &o, &bad) == PLEIO_ERR_ARGUMENT && bad == NULL, "size too small");
        o.size = sizeof o;
        o.layer = -2;
        CHECK(pleio_open_ex(at("fp8"), &o, &bad) == PLEIO_ERR_ARGUMENT && bad == NULL, "layer -2");
        o.layer = -1;
        CHECK(pleio_open_ex(NULL, &o, &bad) == PLEIO_ERR_ARGUMENT, "NULL path");
        CHECK(pleio_open_ex(at("fp8"), &o, NULL) == PLEIO_ERR_ARGUMENT, "NULL out");
        o.tensor = "no_such.weight";
        CHECK(pleio_open_ex(at("q.gguf"), &o, &bad) == PLEIO_ERR_NO_TABLE && bad == NULL, "open_ex no such tensor");
        o.tensor = NULL;
    }

    /* pleio_open_ex: every PLE layer of a two-layer checkpoint */
    {
        size_t cn = 0;
        int64_t *cids = ints("ck_ids.txt", &cn);
        size_t l2 = 0, l0 = 0;
        void *want2 = slurp("two_l2.f32", &l2);
        void *want0 = slurp("two_l0.f32", &l0);
        CHECK(l2 == cn * 160 * 4 && l0 == l2, "two_l2.f32 holds %zu bytes", l2);
        CHECK(memcmp(want2, want0, l2) != 0, "the two layers' rows differ");
        pleio_open_options o;
        memset(&o, 0, sizeof o);
        o.size = sizeof o;
        o.layer = 2;
        pleio_table *v = NULL;
        void *got = malloc(l2);
        CHECK(pleio_open_ex(at("two"), &o, &v) == PLEIO_OK, "open_ex layer 2: %s", pleio_last_error());
        CHECK(pleio_gather(v, cids, cn, PLEIO_DTYPE_F32, got, l2, NULL) == PLEIO_OK &&
                  memcmp(got, want2, l2) == 0,
              "layer 2's rows equal pleio gather --layer 2");
        pleio_close(v);
        o.layer = -1;
        CHECK(pleio_open_ex(at("two"), &o, &v) == PLEIO_OK, "open_ex default layer");
        CHECK(pleio_gather(v, cids, cn, PLEIO_DTYPE_F32, got, l2, NULL) == PLEIO_OK &&
                  memcmp(got, want0, l2) == 0,
              "the default is the lowest PLE layer");
        pleio_close(v);
        pleio_table *bad = NULL;
        o.layer = 1;
        CHECK(pleio_open_ex(at("two"), &o, &bad) == PLEIO_ERR_NO_TABLE && bad == NULL, "layer 1 holds no table");
        CHECK(mentions(pleio_last_error(), "[0, 2]"), "the message names the PLE layers: %s", pleio_last_error());
        free(got);
        free(want2);
        free(want0);
        free(cids);
    }

    /* --- a table in Redis: PLEIO_TEST_REDIS=redis://HOST:PORT, q.gguf published there as "q" --- */
    const char *redis = getenv("PLEIO_TEST_REDIS");
    if (redis == NULL) {
        printf("capi_test: SKIPPED the Redis checks (no PLEIO_TEST_REDIS: redis-server not installed)\n");
    } else {
        char url[512];
        pleio_table *r = NULL;
        snprintf(url, sizeof url, "%s/q", redis);
        CHECK(pleio_open(url, NULL, &r) == PLEIO_OK && r != NULL, "open %s: %s", url, pleio_last_error());
        pleio_info ri;
        memset(&ri, 0, sizeof ri);
        CHECK(r && pleio_table_info(r, &ri) == PLEIO_OK && ri.rows == rows && ri.row_bytes == row_bytes &&
                  mentions(ri.path, "redis://"),
              "a Redis table's info: %s", ri.path);
        for (size_t k = 0; r && k < sizeof kinds / sizeof kinds[0]; k++) {
            size_t len;
            void *expect = slurp(kinds[k].file, &len);
            unsigned char *buf = malloc(len);
            CHECK(pleio_gather(r, ids, n, kinds[k].dtype, buf, len, NULL) == PLEIO_OK, "gather %s from Redis: %s",
                  kinds[k].file, pleio_last_error());
            CHECK(memcmp(buf, expect, len) == 0, "%s: the Redis table equals the file", kinds[k].file);
            free(buf);
            free(expect);
        }
        pleio_sequence *rs = NULL;
        int64_t *got = calloc(n_rows_expected, sizeof *got);
        CHECK(r && pleio_sequence_new(r, &rs) == PLEIO_OK &&
                  pleio_sequence_map(rs, tokens, n_tokens, got, n_rows_expected, NULL) == PLEIO_OK &&
                  memcmp(got, rows_expected, n_rows_expected * sizeof *got) == 0,
              "a Redis table's row ids equal `pleio rows`");
        pleio_sequence_free(rs);
        free(got);
        pleio_close(r);

        pleio_table *none = NULL;
        snprintf(url, sizeof url, "%s/no-such-table", redis);
        CHECK(pleio_open(url, NULL, &none) == PLEIO_ERR_NOT_FOUND && none == NULL, "an unpublished name");
        CHECK(mentions(pleio_last_error(), "pleio publish"), "the message says how: %s", pleio_last_error());
        CHECK(pleio_open("redis://127.0.0.1:1/q?connect_timeout_ms=200&retries=0", NULL, &none) == PLEIO_ERR_REMOTE &&
                  none == NULL,
              "no server: PLEIO_ERR_REMOTE");
        CHECK(mentions(pleio_last_error(), "127.0.0.1:1"), "the message names the node: %s", pleio_last_error());
        CHECK(pleio_open("rediss://127.0.0.1:1/q?tls_ca=/nonexistent/ca.pem", NULL, &none) == PLEIO_ERR_SETUP &&
                  none == NULL,
              "an unreadable TLS file: PLEIO_ERR_SETUP");
        CHECK(mentions(pleio_last_error(), "/nonexistent/ca.pem"), "the message names the file: %s",
              pleio_last_error());
    }

    /* --- closing --- */
    pleio_sequence *orphan = NULL;
    CHECK(pleio_sequence_new(t, &orphan) == PLEIO_OK, "a sequence outliving its table");
    CHECK(pleio_close_timeout(t, 1000) == PLEIO_OK, "pleio_close_timeout of an idle handle");
    CHECK(pleio_close_timeout(t, 0) == PLEIO_ERR_HANDLE, "pleio_close_timeout of a closed handle");
    CHECK(pleio_close_timeout(NULL, 0) == PLEIO_ERR_HANDLE, "pleio_close_timeout of NULL");
    {
        /* its slot is reused by the next open; the stale handle stays dead */
        pleio_table *again = NULL;
        CHECK(pleio_open(at("q.gguf"), NULL, &again) == PLEIO_OK && again != t, "reopen: a new handle");
        CHECK(pleio_table_info(t, &info) == PLEIO_ERR_HANDLE, "the stale handle is refused");
        CHECK(pleio_table_info(again, &info) == PLEIO_OK, "the new one works");
        pleio_close(again);
    }
    CHECK(pleio_gather(t, ids, 1, PLEIO_DTYPE_F32, row, one, NULL) == PLEIO_ERR_HANDLE, "closed handle");
    CHECK(mentions(pleio_last_error(), "closed"), "message says closed");
    CHECK(pleio_table_info(t, &info) == PLEIO_ERR_HANDLE, "info of a closed handle");
    pleio_close(t);
    pleio_close(NULL);
    int64_t orphan_rows[64];
    CHECK(pleio_sequence_map(orphan, tokens, 1, orphan_rows, 64, NULL) == PLEIO_OK, "the sequence still maps");
    pleio_sequence_free(orphan);

    free(row);
    free(ids);
    free(ids32);
    free(tokens);
    free(tokens64);
    free(rows_expected);
    printf("capi_test: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
