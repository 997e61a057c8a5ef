// One pleio_table handle from many C++ threads at once, built by
// scripts/capi_test.sh (C++17, -fsanitize=address,undefined, linked to
// libpleio_capi.so).
//
//   capi_threads DIR
//
// DIR as for capi_test.c, plus all.f32: the CLI's f32 rows of every row of
// q.gguf in order. Eight threads gather random batches (int64 and int32
// ids, every dtype for f32 and raw, prefetch/wait, their own sequences)
// from one handle and compare each row with all.f32; then threads keep
// gathering while the main thread closes the handle, and every call must
// either succeed exactly or fail with PLEIO_ERR_HANDLE. Prints
// "N passed, M failed"; exits 1 on any failure.
#include "pleio.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<int> passed{0}, failed{0};

void check(bool ok, const std::string &what) {
    if (ok) {
        ++passed;
    } else {
        ++failed;
        std::fprintf(stderr, "FAIL: %s (last error: %s)\n", what.c_str(), pleio_last_error());
    }
}

std::vector<char> slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(2);
    }
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

struct Fixture {
    std::vector<float> all;  // every row, f32
    std::vector<char> file;  // q.gguf
    uint64_t rows = 0, row_elems = 0, row_bytes = 0, offset = 0;
};

// One worker: `rounds` random batches checked against the fixture.
void worker(pleio_table *t, const Fixture &fx, unsigned seed, int rounds) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<uint64_t> pick(0, fx.rows - 1);
    std::uniform_int_distribution<int> size(1, 96);
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        const int n = size(rng);
        std::vector<int64_t> ids(n);
        std::vector<int32_t> ids32(n);
        for (int i = 0; i < n; i++) ids32[i] = static_cast<int32_t>(ids[i] = static_cast<int64_t>(pick(rng)));
        std::vector<float> out(n * fx.row_elems);
        const size_t bytes = out.size() * sizeof(float);
        int rc;
        switch (r % 4) {
            case 0:
                rc = pleio_gather(t, ids.data(), n, PLEIO_DTYPE_F32, out.data(), bytes, nullptr);
                break;
            case 1:
                rc = pleio_gather_i32(t, ids32.data(), n, PLEIO_DTYPE_F32, out.data(), bytes, nullptr);
                break;
            case 2: {
                pleio_batch *p = nullptr;
                rc = pleio_prefetch_i32(t, ids32.data(), n, &p);
                if (rc == PLEIO_OK) rc = pleio_wait(p, out.data(), bytes, nullptr);
                break;
            }
            default: {
                std::vector<unsigned char> raw(n * fx.row_bytes);
                rc = pleio_gather(t, ids.data(), n, PLEIO_DTYPE_RAW, raw.data(), raw.size(), nullptr);
                for (int i = 0; rc == PLEIO_OK && i < n; i++)
                    bad += std::memcmp(raw.data() + i * fx.row_bytes,
                                       fx.file.data() + fx.offset + ids[i] * fx.row_bytes, fx.row_bytes) != 0;
                rc = rc == PLEIO_OK ? pleio_gather(t, ids.data(), n, PLEIO_DTYPE_F32, out.data(), bytes, nullptr) : rc;
            }
        }
        if (rc != PLEIO_OK) {
            check(false, "gather in thread " + std::to_string(seed) + " returned " + std::to_string(rc));
            return;
        }
        for (int i = 0; i < n; i++)
            bad += std::memcmp(out.data() + i * fx.row_elems, fx.all.data() + ids[i] * fx.row_elems,
                               fx.row_elems * sizeof(float)) != 0;
    }
    check(bad == 0, "thread " + std::to_string(seed) + ": " + std::to_string(bad) + " rows differ");
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    Fixture fx;
    {
        std::ifstream meta(dir + "/meta.txt");
        std::string type_name;
        meta >> fx.rows >> fx.row_elems >> fx.row_bytes >> type_name >> fx.offset;
        if (!meta) {
            std::fprintf(stderr, "cannot read meta.txt\n");
            return 2;
        }
    }
    {
        std::vector<char> all = slurp(dir + "/all.f32");
        fx.all.resize(all.size() / sizeof(float));
        std::memcpy(fx.all.data(), all.data(), all.size());
    }
    fx.file = slurp(dir + "/q.gguf");
    check(fx.all.size() == fx.rows * fx.row_elems, "all.f32 holds every row");

    pleio_table *t = nullptr;
    check(pleio_open((dir + "/q.gguf").c_str(), nullptr, &t) == PLEIO_OK, "open");

    // Eight threads at once on one handle, each its own rows.
    {
        std::vector<std::thread> threads;
        for (unsigned i = 0; i < 8; i++) threads.emplace_back(worker, t, std::cref(fx), i + 1, 200);
        for (auto &th : threads) th.join();
    }

    // Sequences: one per thread, each mapping the same tokens, all equal.
    {
        std::vector<char> toks_text = slurp(dir + "/tokens.txt");
        std::vector<int32_t> tokens;
        {
            std::string s(toks_text.begin(), toks_text.end());
            size_t pos = 0;
            while (pos < s.size()) {
                size_t end = s.find_first_of(" \n\t", pos);
                if (end == std::string::npos) end = s.size();
                if (end > pos) tokens.push_back(std::stoi(s.substr(pos, end - pos)));
                pos = end + 1;
            }
        }
        pleio_info info;
        check(pleio_table_info(t, &info) == PLEIO_OK, "info");
        std::vector<std::vector<int64_t>> got(4, std::vector<int64_t>(tokens.size() * info.rows_per_token));
        std::vector<std::thread> threads;
        for (int i = 0; i < 4; i++)
            threads.emplace_back([&, i] {
                pleio_sequence *s = nullptr;
                bool ok = pleio_sequence_new(t, &s) == PLEIO_OK;
                for (size_t k = 0; ok && k < tokens.size(); k++)
                    ok = pleio_sequence_map(s, &tokens[k], 1, &got[i][k * info.rows_per_token],
                                            info.rows_per_token, nullptr) == PLEIO_OK;
                pleio_sequence_free(s);
                check(ok, "sequence in thread " + std::to_string(i));
            });
        for (auto &th : threads) th.join();
        for (int i = 1; i < 4; i++) check(got[i] == got[0], "sequences agree");
    }

    // Close while others gather: each call succeeds exactly or reports a
    // closed handle; nothing crashes. Every thread gathers at least once
    // before the close and runs until it sees the handle closed.
    {
        std::atomic<int> ok_calls{0}, closed_calls{0}, other{0}, started{0};
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        std::vector<std::thread> threads;
        for (unsigned i = 0; i < 4; i++)
            threads.emplace_back([&, i] {
                std::vector<float> out(fx.row_elems);
                int64_t id = i;
                bool first = true;
                while (std::chrono::steady_clock::now() < give_up) {
                    int rc = pleio_gather(t, &id, 1, PLEIO_DTYPE_F32, out.data(), out.size() * 4, nullptr);
                    if (rc == PLEIO_OK) {
                        ++ok_calls;
                        if (first) ++started;
                        first = false;
                        if (std::memcmp(out.data(), fx.all.data() + id * fx.row_elems, fx.row_elems * 4) != 0)
                            ++other;
                    } else if (rc == PLEIO_ERR_HANDLE) {
                        ++closed_calls;
                        break;
                    } else {
                        ++other;
                        break;
                    }
                }
            });
        while (started < 4 && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        pleio_close(t);
        for (auto &th : threads) th.join();
        check(other == 0, "calls racing a close: " + std::to_string(other.load()) + " wrong");
        check(started == 4 && closed_calls == 4,
              std::to_string(started.load()) + " threads gathered (" + std::to_string(ok_calls.load()) +
                  " gathers) before the close, " + std::to_string(closed_calls.load()) +
                  " saw PLEIO_ERR_HANDLE after it");
    }

    std::printf("capi_threads: %d passed, %d failed\n", passed.load(), failed.load());
    return failed ? 1 : 0;
}
