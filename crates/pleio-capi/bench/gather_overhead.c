/*
 * Warm gather latency through the C ABI, for scripts/py_bench.py (which
 * builds it with -O2 against libpleio_capi.a and runs the same protocol
 * from Rust, crates/pleio-benches/examples/gather_overhead.rs, and Python).
 *
 *   gather_overhead TABLE IDS_FILE ROUNDS
 *
 * IDS_FILE holds one batch of row ids per line. Every batch is gathered
 * twice to warm the table, then ROUNDS times all batches in order; prints
 * {"ns_per_gather": [one mean per round]} as JSON.
 */
#define _POSIX_C_SOURCE 200809L
#include "pleio.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TABLE IDS_FILE ROUNDS\n", argv[0]);
        return 2;
    }
    pleio_table *t = NULL;
    if (pleio_open(argv[1], NULL, &t) != PLEIO_OK) {
        fprintf(stderr, "open: %s\n", pleio_last_error());
        return 1;
    }
    pleio_info info;
    pleio_table_info(t, &info);
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    int rounds = atoi(argv[3]);
    /* batches: flat ids with per-batch offsets */
    size_t cap = 1 << 16, n_ids = 0, n_batches = 0, max_len = 0;
    int64_t *ids = malloc(cap * sizeof *ids);
    size_t *start = malloc(4097 * sizeof *start);
    char line[1 << 16];
    while (fgets(line, sizeof line, f) && n_batches < 4096) {
        start[n_batches] = n_ids;
        for (char *p = strtok(line, " \n"); p; p = strtok(NULL, " \n")) {
            if (n_ids == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
            ids[n_ids++] = strtoll(p, NULL, 10);
        }
        if (n_ids - start[n_batches] > max_len) max_len = n_ids - start[n_batches];
        n_batches++;
    }
    start[n_batches] = n_ids;
    fclose(f);
    size_t out_bytes = max_len * info.row_elems * sizeof(float);
    float *out = malloc(out_bytes);
    for (int warm = 0; warm < 2; warm++)
        for (size_t b = 0; b < n_batches; b++)
            if (pleio_gather(t, ids + start[b], start[b + 1] - start[b], PLEIO_DTYPE_F32, out, out_bytes, NULL)) {
                fprintf(stderr, "gather: %s\n", pleio_last_error());
                return 1;
            }
    printf("{\"ns_per_gather\": [");
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (size_t b = 0; b < n_batches; b++)
            pleio_gather(t, ids + start[b], start[b + 1] - start[b], PLEIO_DTYPE_F32, out, out_bytes, NULL);
        printf("%s%.1f", r ? ", " : "", (now_ns() - t0) / (double)n_batches);
    }
    printf("]}\n");
    pleio_close(t);
    free(out);
    free(ids);
    free(start);
    return 0;
}
