/* rounding_model.c (session 34): the rounding of reverse KL's D on the host, V = 128256, against fp64:
 * the two-read row kernel (256 strided partial sums), plain split sums Σ e^{z−m}(z − zt), and the
 * relative form of patch 0002 (64-column fragments summed plainly, then moved to Σ e((z − m) − (zt − c)),
 * merged over 64-column tiles and 6 splits with the (m − m')·s term). gcc -O2 rounding_model.c -lm;
 * ./a.out ROWS SD NOISE OFFSET (the README table: 20 rows each). Not part of the build. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
static double nrm(void) { double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0); return sqrt(-2 * log(u)) * cos(6.283185307179586 * v); }
int main(int argc, char **argv) {
    const int V = 128256, S = 6, TW = 64;
    float *zs = malloc(V * 4), *zt = malloc(V * 4);
    double worst2 = 0, worst1 = 0, sum2 = 0, sum1 = 0, worst3 = 0, sum3 = 0; int rows = atoi(argv[1]); double sd = atof(argv[2]), near = atof(argv[3]), shift = atof(argv[4]);
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < V; j++) { double a = sd * nrm(); zs[j] = (float)a; zt[j] = (float)(a + near * sd * nrm() + shift); }
        /* fp64 reference */
        double ms = -INFINITY, mt = -INFINITY; for (int j = 0; j < V; j++) { ms = fmax(ms, zs[j]); mt = fmax(mt, zt[j]); }
        double ss = 0, st = 0; for (int j = 0; j < V; j++) { ss += exp(zs[j] - ms); st += exp(zt[j] - mt); }
        double ls = ms + log(ss), lt = mt + log(st), D = 0;
        for (int j = 0; j < V; j++) { double q = exp(zs[j] - ls); D += q * ((zs[j] - ls) - (zt[j] - lt)); }
        /* lse's in fp32 as the kernels get them (exact enough: use rounded fp64) */
        float lsf = (float)ls, ltf = (float)lt;
        /* two-read: 256 threads strided, then sum of the 256 partials */
        float part[256] = {0};
        for (int j = 0; j < V; j++) { float lq = zs[j] - lsf, lp = zt[j] - ltf, q = expf(lq); part[j % 256] += q == 0.f ? 0.f : q * (lq - lp); }
        float d2 = 0; for (int k = 0; k < 256; k++) d2 += part[k];
        /* split sums */
        const int per = (V + S - 1) / S;
        float d1 = 0;
        for (int k = 0; k < S; k++) {
            float M = -INFINITY, Ssum = 0, T = 0;
            for (int j0 = k * per; j0 < V && j0 < (k + 1) * per; j0 += TW) {
                float m = -INFINITY, s = 0, t = 0;
                for (int j = j0; j < j0 + TW && j < V && j < (k + 1) * per; j++) m = fmaxf(m, zs[j]);
                for (int j = j0; j < j0 + TW && j < V && j < (k + 1) * per; j++) { float e = expf(zs[j] - m); s += e; t += e > 0 ? e * (zs[j] - zt[j]) : 0; }
                float mm = fmaxf(M, m), ea = expf(M - mm), eb = expf(m - mm);
                Ssum = Ssum * ea + s * eb; T = T * ea + t * eb; M = mm;
            }
            if (Ssum != 0) d1 += T * expf(M - lsf);
        }
        d1 += ltf - lsf;
        /* relative form: u = Σ e^{z−m}((z − m) − (zt − c)), c = lse_t (known before the student pass), merged
         * with u' = e^{m−m'}(u + (m − m')·s); D = Σ_k e^{m_k − lse_s}(u_k + (m_k − lse_s)·s_k) */
        float d3 = 0;
        for (int k = 0; k < S; k++) {
            float M = -INFINITY, Ssum = 0, U = 0;
            for (int j0 = k * per; j0 < V && j0 < (k + 1) * per; j0 += TW) {
                float m = -INFINITY, s = 0, u = 0;
                for (int j = j0; j < j0 + TW && j < V && j < (k + 1) * per; j++) m = fmaxf(m, zs[j]);
                for (int j = j0; j < j0 + TW && j < V && j < (k + 1) * per; j++) { float e = expf(zs[j] - m); s += e; u += e > 0 ? e * (zs[j] - zt[j]) : 0; }
                u = fmaf(fminf(ltf - m, 3.0e38f), s, u);
                float mm = fmaxf(M, m), ea = expf(M - mm), eb = expf(m - mm);
                float ua = Ssum == 0 ? 0 : ea * (U + (M - mm) * Ssum), ub = eb * (u + (m - mm) * s);
                Ssum = Ssum * ea + s * eb; U = ua + ub; M = mm;
            }
            if (Ssum != 0) d3 += (U + (M - lsf) * Ssum) * expf(M - lsf);
        }
        double e3 = fabs(d3 - D); sum3 += e3; if (e3 > worst3) worst3 = e3;
        double e2 = fabs(d2 - D), e1 = fabs(d1 - D);
        sum2 += e2, sum1 += e1; if (e2 > worst2) worst2 = e2; if (e1 > worst1) worst1 = e1;
        if (r == 0) printf("  row 0: D %.6g, lse_s − lse_t %.3g\n", D, ls - lt);
    }
    printf("sd %g near %g shift %g: |D err| two-read mean %.2e worst %.2e; split sums mean %.2e worst %.2e; relative form mean %.2e worst %.2e\n", sd, near, shift, sum2 / rows, worst2, sum1 / rows, worst1, sum3 / rows, worst3);
}
