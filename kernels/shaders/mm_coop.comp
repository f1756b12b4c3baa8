// Prompt-batch products on cooperative matrices (tensor cores): mm.comp's
// push constants and MODEs with a BM x BN tile (weight rows x tokens) per
// workgroup of 4 warps of 32 invocations. Each BK step dequantizes the weight
// tile (dq8) and converts the activations to f16 in shared memory; products
// accumulate in f32. The next step's global loads are issued before this
// step's matrix products (register prefetch), so their latency hides.
// MODE 0: y[t] = W x[t] (+ r[t])                                grid (rows/BM, n/BN)
// MODE 1: experts gate+up over the pair list of expert z (moe_sort):
//         y[p] = silu(Wg_z x[p/k]) * (Wu_z x[p/k])              grid (rows/BM, n/BN, n_expert)
// MODE 2: experts down: y[p] = gw[p] * Wd_z x[p]                grid as MODE 1
// Warp w owns tile rows w*WR .. w*WR+WR-1 and all BN columns: FM x FN
// accumulators of CM x CN; fragments past an expert's last pair are skipped.
// The host defines BM BN BK CM CN CK and EMU. EMU=1 stands a shared-memory
// model in for the matrix unit (same loads, layouts and epilogue), so devices
// without cooperative matrices (lavapipe in CI) test the rest of the kernel.
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable
#if !EMU
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#endif

#define WARPS 4u
#define WR (BM / WARPS)            // tile rows per warp
#define FM (WR / CM)               // accumulators along the rows
#define FN (BN / CN)               // along the tokens
#define LDS (BK + 8u)              // shared row stride in halfs: 16-byte aligned, conflict-free fragment loads
#define NE (CM * CN / 32u)         // accumulator elements per invocation in the epilogue
#define NWL (BM / 32u)             // weight rows each invocation dequantizes per step (4 per row, 8 columns each)
#define XPT (BN * BK / 128u)       // activations each invocation converts per step
#define XTH (BK / XPT)             // invocations per token
layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    U32 w; U32 w2; V4 x; F32 y; F32 r; I32 meta; F32 gw; U32 unused_;
    uint rows, cols, n, xs, ys, flags, k, estride, n_expert;
} pc;

shared float16_t Ws[BM * LDS];
#if MODE == 1
shared float16_t Us[BM * LDS];
#endif
shared float16_t Xs[BN * LDS];
shared float Cs[WARPS * CM * CN];   // each warp's accumulator staging for the epilogue
shared int xrow[BN];                // activation row of each tile column, -1 past the end
shared int orow[BN];                // output row (token or pair)

#if EMU
#define UNROLL [[dont_unroll]]   // rolled loops keep the stand-in quick to compile on CPU drivers
// Element e of an accumulator lives at tile index e*32 + lane, column-major in CM x CN.
struct acc_t { float v[NE]; };
#define ACC acc_t
#define FRAG_A uint
#define FRAG_B uint
#define ACC_LEN int(NE)
#define ACC_AT(a, e) (a).v[e]
#define LOAD_A(f, arr, off) f = (off)
#define LOAD_B(f, off) f = (off)
#define MMA_W(c, a, b) c = emu_mma(false, a, b, c)
#define MMA_U(c, a, b) c = emu_mma(true, a, b, c)
acc_t acc_zero() {
    acc_t z;
    UNROLL for (uint e = 0u; e < NE; e++) z.v[e] = 0.0;
    return z;
}
// A: CM x CK row-major at ao (stride LDS) of Ws or Us; B: CK x CN column-major at bo of Xs.
acc_t emu_mma(bool u, uint ao, uint bo, acc_t c) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < NE; e++) {
        const uint idx = e * 32u + lane, r = idx % CM, col = idx / CM;
        float s = c.v[e];
        UNROLL for (uint q = 0u; q < CK; q++) {
#if MODE == 1
            const float a = u ? float(Us[ao + r * LDS + q]) : float(Ws[ao + r * LDS + q]);
#else
            const float a = float(Ws[ao + r * LDS + q]);
#endif
            s += a * float(Xs[bo + col * LDS + q]);
        }
        c.v[e] = s;
    }
    return c;
}
void store_c(acc_t c, uint base) {
    const uint lane = gl_LocalInvocationIndex % 32u;
    UNROLL for (uint e = 0u; e < NE; e++) Cs[base + e * 32u + lane] = c.v[e];
}
#define STORE_C(c, base) store_c(c, base)
#else
#define UNROLL [[unroll]]   // accumulators are registers only once their indices are constants
#define ACC fcoopmatNV<32, gl_ScopeSubgroup, CM, CN>
#define FRAG_A fcoopmatNV<16, gl_ScopeSubgroup, CM, CK>
#define FRAG_B fcoopmatNV<16, gl_ScopeSubgroup, CK, CN>
#define ACC_LEN acc[0].length()
#define ACC_AT(a, e) (a)[e]
#define LOAD_A(f, arr, off) coopMatLoadNV(f, arr, off, LDS, false)
#define LOAD_B(f, off) coopMatLoadNV(f, Xs, off, LDS, true)
#define MMA_W(c, a, b) c = coopMatMulAddNV(a, b, c)
#define MMA_U(c, a, b) c = coopMatMulAddNV(a, b, c)
ACC acc_zero() { return ACC(0.0); }
#define STORE_C(c, base) coopMatStoreNV(c, Cs, base, CM, true)
#endif

// Registers between a step's global loads and its shared-memory stores.
f16vec4 wreg[2u * NWL];
#if MODE == 1
f16vec4 ureg[2u * NWL];
#endif
f16vec4 xreg[XPT / 4u];

void fetch(uint k0, uint estart, uint rowbytes, uint lr, uint lc, int lx, uint xk) {
    UNROLL for (uint i = 0u; i < NWL; i++) {
        const uint row = gl_WorkGroupID.x * BM + lr + 32u * i;
        vec4 a = vec4(0.0), b = vec4(0.0);
        if (row < pc.rows) dq8(pc.w, estart + row * rowbytes, k0 + lc, a, b);
        wreg[2u * i] = f16vec4(a);
        wreg[2u * i + 1u] = f16vec4(b);
#if MODE == 1
        a = vec4(0.0); b = vec4(0.0);
        if (row < pc.rows) dq8(pc.w2, estart + row * rowbytes, k0 + lc, a, b);
        ureg[2u * i] = f16vec4(a);
        ureg[2u * i + 1u] = f16vec4(b);
#endif
    }
    const uint xo = lx >= 0 ? (uint(lx) * pc.xs + k0 + xk) / 4u : 0u;
    // clamped to f16's range: an activation beyond it would become inf and poison the whole output row
    UNROLL for (uint q = 0u; q < XPT / 4u; q++)
        xreg[q] = lx >= 0 ? f16vec4(clamp(pc.x.v[xo + q], vec4(-65504.0), vec4(65504.0))) : f16vec4(0.0);
}

void stash(uint lr, uint lc, uint xc, uint xk) {
    UNROLL for (uint i = 0u; i < NWL; i++) {
        const uint o = (lr + 32u * i) * LDS + lc;
        UNROLL for (uint j = 0u; j < 4u; j++) {
            Ws[o + j] = wreg[2u * i][j];
            Ws[o + 4u + j] = wreg[2u * i + 1u][j];
#if MODE == 1
            Us[o + j] = ureg[2u * i][j];
            Us[o + 4u + j] = ureg[2u * i + 1u][j];
#endif
        }
    }
    UNROLL for (uint q = 0u; q < XPT / 4u; q++)
        UNROLL for (uint j = 0u; j < 4u; j++) Xs[xc * LDS + xk + 4u * q + j] = xreg[q][j];
}

void main() {
    const uint tid = gl_LocalInvocationIndex, warp = tid / 32u, lane = tid % 32u;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
#if MODE == 0
    const uint estart = 0u;
    const uint cnt = pc.n;
#else
    const uint e = gl_WorkGroupID.z;
    const uint cnt = uint(pc.meta.v[e]), lbase = uint(pc.meta.v[pc.n_expert + e]);
    const uint estart = e * pc.estride;
#endif
    if (col0 >= cnt) return;   // uniform: this expert has fewer pairs
    if (tid < BN) {
        const uint i = col0 + tid;
        int xr = -1, orr = -1;
        if (i < cnt) {
#if MODE == 0
            xr = int(i); orr = int(i);
#else
            const int p = pc.meta.v[2u * pc.n_expert + lbase + i];
            orr = p;
            xr = MODE == 1 ? p / int(pc.k) : p;
#endif
        }
        xrow[tid] = xr;
        orow[tid] = orr;
    }
    barrier();
    const uint nf = min(FN, (cnt - col0 + CN - 1u) / CN);   // accumulators with a live token
    const uint lr = tid / 4u, lc = (tid % 4u) * 8u, xc = tid / XTH, xk = (tid % XTH) * XPT;
    const int lx = xrow[xc];
    const uint rowbytes = (pc.cols / BLK) * BLK_BYTES;
    ACC acc[FM * FN];
#if MODE == 1
    ACC accu[FM * FN];
#endif
    UNROLL for (uint i = 0u; i < FM * FN; i++) {
        acc[i] = acc_zero();
#if MODE == 1
        accu[i] = acc_zero();
#endif
    }
    fetch(0u, estart, rowbytes, lr, lc, lx, xk);
    for (uint k0 = 0u; k0 < pc.cols; k0 += BK) {
        barrier();   // the previous step's products are done with shared memory
        stash(lr, lc, xc, xk);
        barrier();
        if (k0 + BK < pc.cols) fetch(k0 + BK, estart, rowbytes, lr, lc, lx, xk);
        UNROLL for (uint kk = 0u; kk < BK; kk += CK) {
            FRAG_A a[FM];
#if MODE == 1
            FRAG_A au[FM];
#endif
            UNROLL for (uint i = 0u; i < FM; i++) {
                LOAD_A(a[i], Ws, (warp * WR + i * CM) * LDS + kk);
#if MODE == 1
                LOAD_A(au[i], Us, (warp * WR + i * CM) * LDS + kk);
#endif
            }
            UNROLL for (uint j = 0u; j < FN; j++) {
                if (j < nf) {   // uniform
                    FRAG_B b;
                    LOAD_B(b, j * CN * LDS + kk);
                    UNROLL for (uint i = 0u; i < FM; i++) {
                        MMA_W(acc[i * FN + j], a[i], b);
#if MODE == 1
                        MMA_U(accu[i * FN + j], au[i], b);
#endif
                    }
                }
            }
        }
    }
    // Epilogue: each accumulator through the warp's staging area, then bounds,
    // residual / silu / gate weight and the scatter to the output row.
    const uint sbase = warp * CM * CN;
    UNROLL for (uint i = 0u; i < FM; i++)
        UNROLL for (uint j = 0u; j < FN; j++) {
#if MODE == 1
            UNROLL for (int q = 0; q < ACC_LEN; q++)
                ACC_AT(acc[i * FN + j], q) = silu(ACC_AT(acc[i * FN + j], q)) * ACC_AT(accu[i * FN + j], q);
#endif
            STORE_C(acc[i * FN + j], sbase);
            barrier();
            UNROLL for (uint q = 0u; q < NE; q++) {
                const uint idx = q * 32u + lane, row = row0 + warp * WR + i * CM + idx % CM;
                const int orr = orow[j * CN + idx / CM];
                if (row >= pc.rows || orr < 0) continue;
                const uint o = uint(orr) * pc.ys + row;
                float v = Cs[sbase + idx];
#if MODE == 0
                if ((pc.flags & 1u) != 0u) v += pc.r.v[o];
#elif MODE == 2
                v *= pc.gw.v[orr];
#endif
                pc.y.v[o] = v;
            }
            barrier();
        }
}
