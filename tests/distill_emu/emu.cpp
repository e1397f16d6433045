/* emu.cpp — runs templates/distill.cu's kernels on the host (shim.h) the way runtime/distill.c
 * launches them (the same argument structs: chunks, GEMM strides, count, rows, reduce) on small
 * random fp32 data, and compares loss, per-token divergence, dHs and dWs with testing/ref.c
 * ref_distill in fp64. The case is compiled in (distill_emu.sh writes k.cu: the generated
 * constants, then the template); argv[1] is the token chunk. Exit 0 when every error < 1e-5. */
#include "shim.h"
thread_local emu_dim threadIdx;
emu_dim emu_block, gridDim;
pthread_barrier_t emu_block_bar, emu_warp_bar[8];
float emu_shfl[256];
#include "k.cu"
#include <cstdio>
#include <cstdlib>
#include <vector>
extern "C" {
#include "ref.h"
}
/* One launch: 256 threads for the whole grid, walking the CTAs in order (a barrier between two). */
template <class P> struct job {
    void (*fn)(P);
    P p;
    unsigned tid;
    long long grid;
};
template <class P> static void *body(void *a)
{
    job<P> *j = (job<P> *)a;
    threadIdx = {j->tid, 0, 0};
    for (long long b = 0; b < j->grid; b++) {
        if (j->tid == 0) emu_block = {(unsigned)b, 0, 0};
        pthread_barrier_wait(&emu_block_bar);
        j->fn(j->p);
        pthread_barrier_wait(&emu_block_bar);
    }
    return nullptr;
}
template <class P> static void run(void (*fn)(P), long long grid, P p)
{
    gridDim = {(unsigned)grid, 1, 1};
    pthread_t th[256];
    static job<P> jobs[256];
    for (unsigned t = 0; t < 256; t++) {
        jobs[t] = {fn, p, t, grid};
        pthread_create(&th[t], nullptr, body<P>, &jobs[t]);
    }
    for (int t = 0; t < 256; t++) pthread_join(th[t], nullptr);
}
static double rnd() { return (rand() / (double)RAND_MAX - 0.5) * 2; }
int main(int argc, char **argv)
{
    pthread_barrier_init(&emu_block_bar, nullptr, 256);
    for (int w = 0; w < 8; w++) pthread_barrier_init(&emu_warp_bar[w], nullptr, 32);
    const long long n = 40, ds = 24, dt = 32, v = 150, chunk = atoi(argv[1]);
    std::vector<float> hs(n * ds), ws(v * ds), ht(n * dt), wt(v * dt);
    std::vector<double> dhs(n * ds), dws(v * ds), dht(n * dt), dwt(v * dt);
    for (long long i = 0; i < n * ds; i++) hs[i] = rnd(), dhs[i] = hs[i];
    for (long long i = 0; i < v * ds; i++) ws[i] = rnd() * 0.6, dws[i] = ws[i];
    for (long long i = 0; i < n * dt; i++) ht[i] = rnd(), dht[i] = ht[i];
    for (long long i = 0; i < v * dt; i++) wt[i] = rnd() * 0.7, dwt[i] = wt[i];
    if (NANROW >= 0) ht[NANROW * dt + 2] = NAN, dht[NANROW * dt + 2] = NAN;
    std::vector<int> lab(n); std::vector<int64_t> lab64(n);
    for (long long i = 0; i < n; i++) { lab[i] = i % 7 == 3 ? -100 : rand() % v; lab64[i] = lab[i]; }
    const long long nl = FLCE_REDUCTION == 2 ? n : 1;
    std::vector<float> go(nl); std::vector<double> god(nl);
    for (long long i = 0; i < nl; i++) go[i] = 0.5f + (float)(rand() % 100) / 100, god[i] = go[i];
    std::vector<float> zs(chunk * v), zt(chunk * v), dh(n * ds), dw(v * ds), lossrows(n), loss(nl), div(n);
    float count = -1;
    flce_distill_params rp = {zs.data(), zt.data(), DISTILL_LABELS ? lab.data() : nullptr, go.data(), div.data(),
                              lossrows.data(), loss.data(), &count, 0, 0, n, v, -100};
    run(flce_distill_count, 1, rp);
    for (long long r0 = 0; r0 < n; r0 += chunk) {
        long long rows = n - r0 < chunk ? n - r0 : chunk;
        rp.row0 = r0, rp.rows = rows;
        auto tiles = [](long long m, long long nn) { return ((m + 63) / 64) * ((nn + 63) / 64); };
        flce_distill_gemm_params g1 = {ht.data() + r0 * dt, wt.data(), zt.data(), rows, v, dt, dt, 1, 1, dt, v, 0, 0};
        run(flce_distill_gemm, tiles(rows, v), g1);
        flce_distill_gemm_params g2 = {hs.data() + r0 * ds, ws.data(), zs.data(), rows, v, ds, ds, 1, 1, ds, v, 0, 0};
        run(flce_distill_gemm, tiles(rows, v), g2);
        run(flce_distill_row, rows, rp);
        flce_distill_gemm_params g3 = {zs.data(), ws.data(), dh.data() + r0 * ds, rows, ds, v, v, 1, ds, 1, ds, 1, 0};
        run(flce_distill_gemm, tiles(rows, ds), g3);
        flce_distill_gemm_params g4 = {zs.data(), hs.data() + r0 * ds, dw.data(), v, ds, rows, 1, v, ds, 1, ds, 1, r0 > 0};
        run(flce_distill_gemm, tiles(v, ds), g4);
    }
    run(flce_distill_reduce, 1, rp);
    ref_distill_problem p = {(ref_divergence)DIVP, BETAD, 1.0 / (double)INV_TEMP, (double)CE_WEIGHT, -100, (flce_reduction)FLCE_REDUCTION};
    std::vector<double> rl(nl), rdh(n * ds), rdw(v * ds);
    int rc = ref_distill(&p, n, ds, dt, v, dhs.data(), dws.data(), dht.data(), dwt.data(), DISTILL_LABELS ? lab64.data() : nullptr,
                         god.data(), rl.data(), rdh.data(), rdw.data());
    std::vector<double> gl(loss.begin(), loss.end()), gdh(dh.begin(), dh.end()), gdw(dw.begin(), dw.end());
    // per-token divergence via ref_distill_row
    std::vector<double> rdiv(n), gdiv(div.begin(), div.end()), zsr(v), ztr(v);
    for (long long i = 0; i < n; i++) {
        if (DISTILL_LABELS && lab[i] == -100) { rdiv[i] = 0; continue; }
        for (long long j = 0; j < v; j++) {
            double a = 0, b = 0;
            for (long long k = 0; k < ds; k++) a += dhs[i * ds + k] * dws[j * ds + k];
            for (long long k = 0; k < dt; k++) b += dht[i * dt + k] * dwt[j * dt + k];
            zsr[j] = a, ztr[j] = b;
        }
        ref_distill_row_out o;
        ref_distill_row(&p, v, zsr.data(), ztr.data(), DISTILL_LABELS ? lab64[i] : -1, &o, nullptr);
        rdiv[i] = o.divergence;
    }
    if (NANROW >= 0) {
        int bad = 0;
        for (long long i = 0; i < n; i++) {
            if (i == NANROW) { bad += !std::isnan(gdiv[i]) || !std::isnan(gdh[i * ds]); continue; }
            bad += !(fabs(gdiv[i] - rdiv[i]) <= 1e-4 * (1 + fabs(rdiv[i])));
            bad += ref_rel_l2(rdh.data() + i * ds, gdh.data() + i * ds, ds) > 1e-4;
        }
        printf("nan row %d: bad %d count %g\n", NANROW, bad, count);
        return bad != 0;
    }
    double el = ref_rel_l2(rl.data(), gl.data(), nl), ed = ref_rel_l2(rdiv.data(), gdiv.data(), n);
    double eh = ref_rel_l2(rdh.data(), gdh.data(), n * ds), ew = ref_rel_l2(rdw.data(), gdw.data(), v * ds);
    printf("rc %d count %g loss %g vs %g: loss %.2e div %.2e dh %.2e dw %.2e\n", rc, count, gl[0], rl[0], el, ed, eh, ew);
    return !(el < 1e-5 && ed < 1e-5 && eh < 1e-5 && ew < 1e-5);
}
