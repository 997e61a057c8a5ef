/* The C ABI reproductions of issue 26 for scripts/probe26.sh. One line per
 * item: "ITEM<TAB>what happened<TAB>PASS|FAIL". Usage: capi_probe TABLE.gguf */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pleio.h"

static int failures = 0;

static void line(const char *item, int pass, const char *what) {
    printf("%s\t%s\t%s\n", item, what, pass ? "PASS" : "FAIL");
    if (!pass) failures++;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char buf[256];
    long kb = -1;
    while (f && fgets(buf, sizeof buf, f))
        if (strncmp(buf, "VmRSS:", 6) == 0) kb = atol(buf + 6);
    if (f) fclose(f);
    return kb;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define N_IDS 4096
static _Atomic int64_t ids[N_IDS];
static atomic_int stop;
static uint64_t table_rows;

static void *flip(void *arg) {
    (void)arg;
    int bad = 0;
    while (!atomic_load(&stop)) {
        bad = !bad;
        for (int i = 0; i < N_IDS; i++)
            atomic_store_explicit(&ids[i], bad ? ((int64_t)1 << 40) : (int64_t)(i % table_rows),
                                  memory_order_relaxed);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *path = argv[1];
    struct pleio_table *t = NULL;
    if (pleio_open(path, NULL, &t) != 0) {
        line("C setup", 0, "pleio_open failed");
        return 1;
    }
    struct pleio_info info;
    pleio_table_info(t, &info);
    table_rows = info.rows;
    size_t row_bytes = info.row_elems * 4;

    /* High 1 (C door): ids rewritten by another thread during pleio_gather. */
    {
        float *out = malloc(N_IDS * row_bytes);
        int ok = 0, refused = 0, other = 0;
        for (int i = 0; i < N_IDS; i++) atomic_store(&ids[i], i % (int64_t)table_rows);
        pthread_t th;
        atomic_store(&stop, 0);
        pthread_create(&th, NULL, flip, NULL);
        const char *strategies[] = {"fault", "advise", "auto"};
        for (int s = 0; s < 3; s++) {
            struct pleio_table *ts = NULL;
            pleio_open_with(path, NULL, strategies[s], &ts);
            double end = now() + 0.5;
            while (now() < end) {
                int rc = pleio_gather(ts, (const int64_t *)ids, N_IDS, PLEIO_DTYPE_F32, out,
                                      N_IDS * row_bytes, NULL);
                if (rc == 0) ok++;
                else if (rc == PLEIO_ERR_ROW_OUT_OF_RANGE) refused++;
                else other++;
            }
            pleio_close(ts);
        }
        atomic_store(&stop, 1);
        pthread_join(th, NULL);
        char what[200];
        snprintf(what, sizeof what,
                 "fault/advise/auto, ids flipped to 2^40 meanwhile: %d gathers ok, %d refused, %d other, no crash",
                 ok, refused, other);
        line("1 (C): ids changed during pleio_gather", other == 0 && refused > 0, what);
        free(out);
    }

    /* High 4: handle slots freed (was +320 B per prefetch/wait, +240 B per open/close). */
    {
        float *out = malloc(8 * row_bytes);
        int64_t few[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        for (int i = 0; i < 1000; i++) { /* warm-up: allocator and worker */
            struct pleio_batch *b = NULL;
            pleio_prefetch(t, few, 8, &b);
            pleio_wait(b, out, 8 * row_bytes, NULL);
        }
        long before = rss_kb();
        int bad = 0;
        for (int i = 0; i < 100000; i++) {
            struct pleio_batch *b = NULL;
            if (pleio_prefetch(t, few, 8, &b) != 0 || pleio_wait(b, out, 8 * row_bytes, NULL) != 0) bad++;
        }
        for (int i = 0; i < 5000; i++) {
            struct pleio_table *u = NULL;
            if (pleio_open(path, NULL, &u) != 0) bad++;
            pleio_close(u);
        }
        long grew = rss_kb() - before;
        char what[200];
        /* unfixed: 100000 * 320 B + 5000 * 240 B = 33 MB */
        snprintf(what, sizeof what, "100000 prefetch/wait + 5000 open/close: RSS grew %ld KiB (leak was ~33000), %d failed", grew, bad);
        line("4: C handle slots reused", bad == 0 && grew < 8192, what);
        free(out);
    }

    /* Low: rows_written overlapping the rows output. */
    {
        struct pleio_sequence *s = NULL;
        pleio_sequence_new(t, &s);
        int32_t tokens[2] = {5, 6};
        int64_t rows[64];
        for (int i = 0; i < 64; i++) rows[i] = -7;
        int rc = pleio_sequence_map(s, tokens, 2, rows, 64, (size_t *)&rows[2]);
        int untouched = 1;
        for (int i = 0; i < 64; i++) untouched &= rows[i] == -7;
        char what[160];
        snprintf(what, sizeof what, "rows_written inside rows: status %d (PLEIO_ERR_ARGUMENT = %d), rows %s",
                 rc, PLEIO_ERR_ARGUMENT, untouched ? "untouched" : "written");
        line("Low: rows_written overlapping rows (C)", rc == PLEIO_ERR_ARGUMENT && untouched, what);
        pleio_sequence_free(s);
    }
    pleio_close(t);
    return failures ? 1 : 0;
}
