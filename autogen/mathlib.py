"""Branch-free polynomial math for generated Numba kernels.

PyPI numba has no SVML, so ``math.exp``/``math.log`` in a loop become scalar
libm calls that block LLVM's loop vectorizer.  The functions here are written
with selects instead of branches, integer bit tricks instead of
``ldexp``/``frexp``, and polynomials, so that after LLVM inlines them an
elementwise loop vectorizes (``<16 x float>``/``<8 x double>`` on AVX-512).

Use from a kernel compiled with ``fastmath=FASTMATH``::

    from autogen import mathlib as __m
    out[i] = __m.exp(a[i])      # float32 in -> float32 math, float64 -> float64

Accuracy: float32 <= 2 ulp, float64 <= 1e-14 relative; IEEE/torch semantics
for inf, nan, overflow, underflow (subnormal results included) and log of
subnormals.  Steps whose rounding matters (range reduction, scaling, the
error term of ``1 + x``) are emitted by the ``@intrinsic`` helpers below
with 'nsz' as their only fast-math flag, so 'reassoc' cannot fold them away.
The functions are compiled once per dtype with FASTMATH and inlined by LLVM,
so their flags do not depend on the calling kernel's fastmath setting.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import isa

__all__ = ['FASTMATH', 'KERNEL_FASTMATH', 'exp', 'expm1', 'log', 'log1p', 'log1pexp', 'tanh', 'sigmoid', 'erf', 'maxnum']

# No 'nnan'/'ninf': NaN/Inf inputs and results must keep IEEE semantics. No 'afn'.
# The math functions here keep 'arcp' on their own divisions (their divisors are finite and
# nonzero by construction, and fast-math flags stay with each instruction when inlined).
FASTMATH = {'nsz', 'arcp', 'contract', 'reassoc'}
# Kernels drop 'arcp' as well: it lets LLVM turn x / y into x * rcp-estimate(y) with a Newton
# step, which is NaN at y = inf where x / inf is 0 (found by fuzzing cosine_embedding_loss with
# a 1e30 input in float32).
KERNEL_FASTMATH = {'nsz', 'contract', 'reassoc'}
# error_model='numpy': float division by zero must give inf/nan, not a
# ZeroDivisionError branch (which would also block vectorization).
_JIT_OPTS = dict(fastmath=FASTMATH, error_model='numpy')

# ---------------------------------------------------------------------------
# LLVM-level helpers.  Numba's fastmath pass adds FASTMATH to every float
# binop that has no flags, so the exact steps below carry 'nsz' alone: that
# keeps them out of reassociation (which would break TwoSum and the two-step
# scaling).  Calls (llvm.fmuladd/rint) do get the flags, which is harmless.
# ---------------------------------------------------------------------------
EXACT_FLAGS = ('nsz',)
# bits -> (int type, mantissa bits, exponent bias)
_FMT = {32: (ir.IntType(32), 23, 127), 64: (ir.IntType(64), 52, 1023)}


@intrinsic
def at(typingctx, address, zero):
    """The pointer to `zero`'s type at integer `address`: a kernel reads a contiguous tensor from its data_ptr()
    (numba.carray(at(address, zero), n)) where a numpy view of it would cost ~1 us a call to make."""
    ptr = types.CPointer(zero)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(address, zero), codegen


def llvm_call(builder, name, fty, args):
    fnty = ir.FunctionType(fty, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty,
                                        '%s.%s' % (name, fty.intrinsic_name))
    return builder.call(fn, args)


def _pow2_ir(builder, n, fty, bits):
    """2**n for integer-valued float n in the normal exponent range.

    n + 1.5*2**mant puts n (two's complement) in the low mantissa bits; adding
    the bias and shifting left by mant builds the exponent field (the magic
    constant's own bits are shifted out)."""
    ity, mant, bias = _FMT[bits]
    t = builder.bitcast(builder.fadd(n, ir.Constant(fty, 1.5 * 2.0 ** mant), flags=EXACT_FLAGS), ity)
    t = builder.shl(builder.add(t, ir.Constant(ity, bias)), ir.Constant(ity, mant))
    return builder.bitcast(t, fty)


def fused_intrinsic(llvm_name):
    """An intrinsic a*b + c of three floats of one type through the LLVM intrinsic `llvm_name`."""
    def typer(typingctx, a, b, c):
        if isinstance(a, types.Float) and a == b == c:
            def codegen(context, builder, sig, args):
                return llvm_call(builder, llvm_name, args[0].type, args)
            return a(a, a, a), codegen
    typer.__name__ = llvm_name.replace(".", "_")
    return intrinsic(typer)


fused_mul_add = fused_intrinsic('llvm.fmuladd')  # fused on FMA hardware, never reassociated


@intrinsic
def horner(typingctx, x, coefs):
    """Polynomial in x, coefficients highest degree first, via fmuladd."""
    if isinstance(x, types.Float) and isinstance(coefs, types.UniTuple) \
            and coefs.dtype == x:
        def codegen(context, builder, sig, args):
            acc = builder.extract_value(args[1], 0)
            for i in range(1, coefs.count):
                acc = llvm_call(builder, 'llvm.fmuladd', acc.type,
                                 [acc, args[0], builder.extract_value(args[1], i)])
            return acc
        return x(x, coefs), codegen


@intrinsic
def strict_add(typingctx, a, b):
    """a + b, never reassociated with neighbouring sums."""
    if isinstance(a, types.Float) and a == b:
        def codegen(context, builder, sig, args):
            return builder.fadd(args[0], args[1], flags=EXACT_FLAGS)
        return a(a, a), codegen


@intrinsic
def cody_waite(typingctx, x, n, hi, lo):
    """(x - n*hi) - n*lo; hi has few enough bits that n*hi and the first
    difference are exact, with or without FMA."""
    if isinstance(x, types.Float) and x == n == hi == lo:
        def codegen(context, builder, sig, args):
            xv, nv, hv, lv = args
            r = builder.fsub(xv, builder.fmul(nv, hv, flags=EXACT_FLAGS), flags=EXACT_FLAGS)
            return builder.fsub(r, builder.fmul(nv, lv, flags=EXACT_FLAGS), flags=EXACT_FLAGS)
        return x(x, x, x, x), codegen


@intrinsic
def round_even(typingctx, x):
    if isinstance(x, types.Float):
        def codegen(context, builder, sig, args):
            return llvm_call(builder, 'llvm.rint', args[0].type, args)
        return x(x), codegen


@intrinsic
def pow2(typingctx, n):
    """2**n, n integer-valued float with 2**n normal."""
    if isinstance(n, types.Float):
        def codegen(context, builder, sig, args):
            return _pow2_ir(builder, args[0], args[0].type, n.bitwidth)
        return n(n), codegen


def _native_ldexp():
    """Whether LLVM lowers a vector llvm.ldexp to one instruction for numba's target (AVX-512's vscalef);
    elsewhere it becomes a libm call per lane. A target named by NUMBA_CPU_NAME (portable caches) may
    lack what the host has: the two-step scaling then."""
    from llvmlite import binding
    from numba.core import config
    return not config.CPU_NAME and bool(binding.get_host_cpu_features().get('avx512f', False))


_NATIVE_LDEXP = _native_ldexp()


@intrinsic
def ldexp2(typingctx, y, n):
    """y * 2**n, n integer-valued, rounded once: results may overflow to inf or round correctly into the
    subnormal range. One vscalef where native; elsewhere two exact power-of-two steps (|n| up to
    bias // 2 + bias - 1), bitwise the same."""
    if isinstance(y, types.Float) and y == n:
        def codegen(context, builder, sig, args):
            yv, nv = args
            fty = yv.type
            ity, mant, _ = _FMT[y.bitwidth]
            if _NATIVE_LDEXP:
                # n as an integer by the magic-number add: defined for every input (fptosi of NaN is poison)
                magic = ir.Constant(fty, 1.5 * 2.0 ** mant)
                k = builder.sub(builder.bitcast(builder.fadd(nv, magic, flags=EXACT_FLAGS), ity),
                                builder.bitcast(magic, ity))
                i32 = ir.IntType(32)
                k = builder.trunc(k, i32) if ity.width > 32 else k
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [fty, i32]),
                                                    'llvm.ldexp.%s.i32' % fty.intrinsic_name)
                return builder.call(fn, [yv, k])
            lim = ir.Constant(fty, float(_FMT[y.bitwidth][2] // 2))
            nc = builder.select(builder.fcmp_ordered('>', nv, lim), lim, nv)
            nc = builder.select(builder.fcmp_ordered('<', nc, builder.fneg(lim)),
                                builder.fneg(lim), nc)
            s1 = _pow2_ir(builder, nc, fty, y.bitwidth)
            s2 = _pow2_ir(builder, builder.fsub(nv, nc, flags=EXACT_FLAGS), fty, y.bitwidth)
            return builder.fmul(builder.fmul(yv, s1, flags=EXACT_FLAGS), s2, flags=EXACT_FLAGS)
        return y(y, n), codegen


@intrinsic
def logsplit(typingctx, x):
    """x = 2**k * m with m in [sqrt(1/2), sqrt(2)); returns (k, m) as floats.
    Valid for positive normal x (callers select the special cases)."""
    if isinstance(x, types.Float):
        ret = types.UniTuple(x, 2)

        def codegen(context, builder, sig, args):
            fty = args[0].type
            ity, mant, _ = _FMT[x.bitwidth]
            off = np.array(math.sqrt(0.5), dtype='f%d' % (x.bitwidth // 8))
            off = ir.Constant(ity, int(off.view('i%d' % (x.bitwidth // 8))))
            bits = builder.bitcast(args[0], ity)
            k = builder.ashr(builder.sub(bits, off), ir.Constant(ity, mant))
            m = builder.bitcast(builder.sub(bits, builder.shl(k, ir.Constant(ity, mant))), fty)
            # int -> float via the magic-number trick (exact, and vectorizes
            # without i64->f64 conversion instructions)
            magic = 1.5 * 2.0 ** mant
            mbits = np.array(magic, dtype='f%d' % (x.bitwidth // 8)).view('i%d' % (x.bitwidth // 8))
            kf = builder.bitcast(builder.add(k, ir.Constant(ity, int(mbits))), fty)
            kf = builder.fsub(kf, ir.Constant(fty, magic), flags=EXACT_FLAGS)
            return context.make_tuple(builder, ret, [kf, m])
        return ret(x), codegen


@intrinsic
def two_sum_exact(typingctx, a, b):
    """(s, e) with s = fl(a+b) and a + b == s + e exactly (Knuth TwoSum)."""
    if isinstance(a, types.Float) and a == b:
        ret = types.UniTuple(a, 2)

        def codegen(context, builder, sig, args):
            av, bv = args
            add = lambda p, q: builder.fadd(p, q, flags=EXACT_FLAGS)
            sub = lambda p, q: builder.fsub(p, q, flags=EXACT_FLAGS)
            s = add(av, bv)
            bb = sub(s, av)
            e = add(sub(av, sub(s, bb)), sub(bv, bb))
            return context.make_tuple(builder, ret, [s, e])
        return ret(a, a), codegen


# ---------------------------------------------------------------------------
# Per-dtype constants.  Polynomials are minimax fits (Lawson IRLS in mpmath,
# relative error unless noted); coefficient tuples are highest degree first.
# ---------------------------------------------------------------------------
CONST = {
    32: dict(
        # exp: x = n*ln2 + r, |r| <= ln2/2 (Cody-Waite, LN2_HI has 9 bits so
        # n*LN2_HI is exact); expm1(r) = r + r^2 * P(r), P degree 5.
        LN2_HI=0.693359375, LN2_LO=-2.12194440e-4,
        EXP_P=(1.984590386670295e-04, 1.394062793574742e-03, 8.33338932993805e-03,
               4.1666360901217586e-02, 1.6666666370584254e-01, 5.00000004416882e-01),
        EXP_HI=89.0, EXP_LO=-105.0,          # beyond: inf / 0 via the scaling
        EXPM1_LO=-40.0, EXPM1_NC=64.0,        # expm1(-40) == -1
        # log (musl logf): log(1+f) = f - f^2/2 + s*(f^2/2 + R(s^2)), s=f/(2+f)
        LOG_HI=6.9313812256e-01, LOG_LO=9.0580006145e-06,
        LG=(0.24279078841, 0.28498786688, 0.40000972152, 0.66666662693),
        TINY=2.0 ** -126, SUB_SCALE=2.0 ** 24, SUB_K=24.0,
        # log1pexp: f = (e - 1)/2 from e = 1/2 up, exact (Sterbenz); f = e below, up to 1/2, past
        # the sqrt(2) - 1 the log polynomial is fitted to, which costs float32 nothing (max 1 ulp)
        LOG1PEXP_SPLIT=0.5,
        # tanh: |x| < 0.625: x + x^3 P(x^2); else 1 - 2/(exp(2|x|)+1)
        TANH_P=(-0.005704750768212186, 0.020638886243589054, -0.053739657044967915,
                0.1333144155181506, -0.33333281920364577),
        TANH_SAT=20.0,
        # erf: |x| < 1: x + x P(x^2); 1 <= |x| <= 4: 1 - exp(-x^2) Q(|x| - 2)
        # (Q ~ erfcx, fitted for absolute error of erfc); erf(4) rounds to 1.
        ERF_P=(7.853973864896879e-05, -8.010243713019005e-04, 5.1883356716893045e-03,
               -2.6853817788284447e-02, 1.1283585351237059e-01, -3.761262585367792e-01,
               1.283791657387003e-01),     # 2/sqrt(pi) - 1: erf = x + x*P
        ERFC_Q=(1.0685824868448517e-04, -2.0229376275982927e-04, 5.034810886153873e-04,
                -1.8574319560609354e-03, 5.475545783407532e-03, -1.544300010074301e-02,
                4.180156958944683e-02, -1.0679778749921245e-01, 2.553956016308741e-01),
        ERFC_C=2.0, ERF_SAT=4.0,
    ),
    64: dict(
        LN2_HI=6.93147180369123816490e-01, LN2_LO=1.90821492927058770002e-10,
        EXP_P=(2.5053787119482443e-08, 2.762603187894044e-07, 2.7557407492862167e-06,
               2.4801505287756455e-05, 1.9841269719070965e-04, 1.3888888931554418e-03,
               8.333333333389521e-03, 4.1666666666576785e-02, 1.6666666666666588e-01,
               5.000000000000006e-01),
        EXP_HI=710.0, EXP_LO=-746.0,
        EXPM1_LO=-40.0, EXPM1_NC=512.0,
        # fdlibm/musl log
        LOG_HI=6.93147180369123816490e-01, LOG_LO=1.90821492927058770002e-10,
        LG=(1.479819860511658591e-01, 1.531383769920937332e-01, 1.818357216161805012e-01,
            2.222219843214978396e-01, 2.857142874366239149e-01, 3.999999999940941908e-01,
            6.666666666666735130e-01),
        TINY=2.0 ** -1022, SUB_SCALE=2.0 ** 54, SUB_K=54.0,
        # log1pexp: in float64 the polynomial past sqrt(2) - 1 costs 5e-15; the rounding of e - 1
        # for e in [sqrt(2) - 1, 1/2) costs less than an ulp (max relative error 3.4e-16)
        LOG1PEXP_SPLIT=math.sqrt(2) - 1,
        TANH_P=(-1.6072525523235248e-05, 7.714430785056308e-05, -2.285641897977546e-04,
                5.863165464117609e-04, -1.4549588855024337e-03, 3.5919891765206304e-03,
                -8.863221003141436e-03, 2.1869487576149132e-02, -5.3968253931270894e-02,
                1.33333333332621e-01, -3.3333333333332854e-01),
        TANH_SAT=20.0,
        ERF_P=(-7.779481475713953e-10, 1.3710994956900669e-08, -1.6206319231228098e-07,
               1.6447132621713555e-06, -1.4924712421107631e-05, 1.2055293585368321e-04,
               -8.548325929698537e-04, 5.2239776061294325e-03, -2.6866170643113346e-02,
               1.1283791670944203e-01, -3.761263890318352e-01, 1.283791670955126e-01),
        ERFC_Q=(1.1721837047684517e-12, -4.0910126366897466e-12, 1.1652351767012078e-12,
                -3.4872251298211366e-11, 2.519131157417247e-10, -8.934445651495216e-10,
                3.6618988447794088e-09, -1.62307255865958e-08, 6.73784667607538e-08,
                -2.727559700445939e-07, 1.0850607127476993e-06, -4.2145205278933806e-06,
                1.596186885964617e-05, -5.886885639493383e-05, 2.1101985087252324e-04,
                -7.335909562026865e-04, 2.467036807325745e-03, -8.001569381581034e-03,
                2.493799708722107e-02, -7.434734678975971e-02, 2.1080636406113998e-01),
        ERFC_C=2.5, ERF_SAT=6.0,
    ),
}


def _build(bits):
    """Compile-able implementations for one float width.  Every constant is
    a closure variable of the target dtype, so float32 code never promotes."""
    dt = np.float32 if bits == 32 else np.float64
    K = {k: (tuple(dt(c) for c in v) if isinstance(v, tuple) else dt(v))
         for k, v in CONST[bits].items()}
    ZERO, HALF, ONE, TWO = dt(0), dt(0.5), dt(1), dt(2)
    INF, NINF, NAN = dt(np.inf), dt(-np.inf), dt(np.nan)
    LOG2E, LN2_HI, LN2_LO = dt(1 / math.log(2)), K['LN2_HI'], K['LN2_LO']
    EXP_P, EXP_HI, EXP_LO = K['EXP_P'], K['EXP_HI'], K['EXP_LO']
    EXPM1_LO, EXPM1_NC = K['EXPM1_LO'], K['EXPM1_NC']
    LOG_HI, LOG_LO, LG = K['LOG_HI'], K['LOG_LO'], K['LG']
    TINY, SUB_SCALE, SUB_K = K['TINY'], K['SUB_SCALE'], K['SUB_K']
    SPLIT = K['LOG1PEXP_SPLIT']
    TANH_P, TANH_SAT, TANH_SMALL = K['TANH_P'], K['TANH_SAT'], dt(0.625)
    ERF_P, ERFC_Q, ERFC_C, ERF_SAT = K['ERF_P'], K['ERFC_Q'], K['ERFC_C'], K['ERF_SAT']
    jit = njit(**_JIT_OPTS)

    @jit
    def reduce_exp(x):
        """(n, expm1(r)) with x = n*ln2 + r."""
        n = round_even(x * LOG2E)
        r = cody_waite(x, n, LN2_HI, LN2_LO)
        return n, fused_mul_add(r * r, horner(r, EXP_P), r)

    @jit
    def exp_small(x):
        """exp(x) for |x| small enough that 2**n is normal (no clamping)."""
        n, p = reduce_exp(x)
        return (ONE + p) * pow2(n)

    @jit
    def exp(x):
        x = EXP_HI if x > EXP_HI else x        # NaN passes through the clamps
        x = EXP_LO if x < EXP_LO else x
        n, p = reduce_exp(x)
        return ldexp2(ONE + p, n)

    @jit
    def expm1(x):
        x = EXP_HI if x > EXP_HI else x
        x = EXPM1_LO if x < EXPM1_LO else x
        n, p = reduce_exp(x)
        # 2**n * (1 + p) - 1 = t*p + (t - 1): n = 0 gives p itself (accurate
        # near 0); t - 1 is exact up to n = mantissa bits + 1 and its rounding
        # is < 1/2 ulp of the result beyond.  Huge n scales in a second step
        # so t stays finite.
        nc = EXPM1_NC if n > EXPM1_NC else n
        t = pow2(nc)
        return fused_mul_add(t, p, t - ONE) * pow2(n - nc)

    @jit
    def log_core(x, corr):
        """log(x) + corr, corr being a tiny correction (log1p's rounding)."""
        sub = x < TINY                          # subnormal: scale up first
        k, m = logsplit(x * SUB_SCALE if sub else x)
        k = k - SUB_K if sub else k
        return log_tail(x, k, m - ONE, corr)

    @jit
    def log_tail(x, k, f, corr):
        """log(x) + corr from x = 2**k * (1 + f), f exact, within [sqrt(1/2) - 1, sqrt(2) - 1] where
        the polynomial is fitted (float32 log1pexp takes f up to 1/2: see LOG1PEXP_SPLIT); the
        special values from x itself."""
        s = f / (TWO + f)
        z = s * s
        hfsq = HALF * f * f
        # musl order: small terms first, then f (exact), then k*ln2_hi
        tail = strict_add(s * (hfsq + z * horner(z, LG)) + fused_mul_add(k, LOG_LO, corr), -hfsq)
        r = fused_mul_add(k, LOG_HI, strict_add(tail, f))
        r = x if x == INF else r
        r = NINF if x == ZERO else r
        return r if x >= ZERO else NAN          # negative or NaN

    @jit
    def log(x):
        return log_core(x, ZERO)

    @jit
    def log1p(x):
        u, e = two_sum_exact(ONE, x)                 # 1 + x == u + e exactly
        return log_core(u, e / u)

    @jit
    def log1pexp(x):
        # log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1]: no overflow for any x.
        # log1p of an argument in [0, 1] needs neither log1p's exact 1 + e nor log's exponent
        # split: 1 + e = 2**k * (1 + f) with f = e (k = 0) or f = (e - 1)/2 (k = 1) above SPLIT, and
        # log's tail of f does the rest, a third less time than log1p(exp(.)). See SPLIT.
        e = exp(-abs(x))
        big = e >= SPLIT
        k = ONE if big else ZERO
        f = (e - ONE) * HALF if big else e
        return (x if x > ZERO else ZERO) + log_tail(ONE, k, f, ZERO)

    @jit
    def tanh(x):
        a = abs(x)
        a = TANH_SAT if a > TANH_SAT else a
        big = ONE - TWO / (exp_small(a + a) + ONE)
        big = big if x >= ZERO else -big
        x2 = x * x
        small = fused_mul_add(x * x2, horner(x2, TANH_P), x)
        return small if a < TANH_SMALL else big

    @jit
    def sigmoid(x):
        # num/(1+e) with e = exp(-|x|) in (0, 1] (no overflow, subnormal
        # results kept), num = e for x < 0 else 1: within 2 ulp in float32,
        # as torch's own. Carrying 1 + e exactly (two_sum and an FMA
        # correction) gives 1 ulp but measured slower than torch's sigmoid.
        e = exp(-abs(x))
        num = ONE if x >= ZERO else e
        return num / (ONE + e)

    @jit
    def erf(x):
        a = abs(x)
        a = ERF_SAT if a > ERF_SAT else a
        big = ONE - exp_small(-(a * a)) * horner(a - ERFC_C, ERFC_Q)
        big = big if x >= ZERO else -big
        small = fused_mul_add(x, horner(x * x, ERF_P), x)
        return small if a < ONE else big

    # reduce_exp and log_tail: building blocks autogen.specfun composes its functions from
    return dict(exp=exp, expm1=expm1, log=log, log1p=log1p, log1pexp=log1pexp, tanh=tanh,
                sigmoid=sigmoid, erf=erf, _reduce_exp=reduce_exp, _log_tail=log_tail)


IMPLS = {32: _build(32), 64: _build(64)}


def _public(name):
    def stub(x):
        # Python-level fallback (scalars only); inside numba the overload
        # below is used instead.
        bits = 32 if isinstance(x, np.float32) else 64
        return IMPLS[bits][name](x if bits == 32 else float(x))
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = '%s(x) for float32/float64 scalars inside numba kernels.' % name

    @overload(stub, jit_options=_JIT_OPTS)
    def _ov(x):
        if isinstance(x, types.Float) and x.bitwidth in IMPLS:
            impl = IMPLS[x.bitwidth][name]
            return lambda x: impl(x)
        if isinstance(x, types.Integer):
            impl = IMPLS[64][name]
            return lambda x: impl(np.float64(x))
    return stub


exp = _public('exp')
expm1 = _public('expm1')
log = _public('log')
log1p = _public('log1p')
log1pexp = _public('log1pexp')
tanh = _public('tanh')
sigmoid = _public('sigmoid')
erf = _public('erf')


@intrinsic
def maxnum(typingctx, a, b):
    """llvm.maxnum: the larger of a and b, a NaN argument ignored. Unlike a compare-and-select,
    LLVM vectorizes it as a reduction without 'nnan' (a row max 5x faster); callers that must
    propagate NaN track it beside (see the max reductions of the primitive table)."""
    if isinstance(a, types.Float) and a == b:
        def codegen(context, builder, sig, args):
            return llvm_call(builder, 'llvm.maxnum', args[0].type, list(args))
        return a(a, a), codegen


# -- bfloat16 and float16 storage: kernels read and write their 16 bits (as uint16 arrays) and compute
# in float32; a value is rounded once, to nearest even, when stored
# (llvmlite types made in each codegen, not read from module globals: a cached kernel's key pickles these
# intrinsics with the globals they read, and an ir type pickles differently once it has been used)


@intrinsic
def widen_bf16(typingctx, u):
    """The float32 of bfloat16 bits: its 16 bits on top of a zero low half."""
    if isinstance(u, types.Integer) and u.bitwidth == 16:
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            return builder.bitcast(builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16)), ir.FloatType())
        return types.float32(u), codegen


@intrinsic
def narrow_bf16(typingctx, x):
    """bfloat16 bits of x, rounded to nearest even (the rounding add carries into the exponent, so a value
    past the largest finite one becomes inf); a NaN stays a quiet NaN."""
    if x == types.float32:
        def codegen(context, builder, sig, args):
            v, i32 = args[0], ir.IntType(32)
            b = builder.bitcast(v, i32)
            hi = builder.lshr(b, ir.Constant(i32, 16))
            lsb = builder.and_(hi, ir.Constant(i32, 1))
            rounded = builder.lshr(builder.add(builder.add(b, ir.Constant(i32, 0x7FFF)), lsb), ir.Constant(i32, 16))
            quiet = builder.or_(hi, ir.Constant(i32, 0x40))
            nan = builder.fcmp_unordered("uno", v, v)
            return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))
        return types.uint16(x), codegen


@intrinsic
def widen_f16(typingctx, u):
    """The float32 of float16 bits (LLVM's fpext: F16C's vcvtph2ps where the CPU has it)."""
    if isinstance(u, types.Integer) and u.bitwidth == 16:
        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(u), codegen


@intrinsic
def narrow_f16(typingctx, x):
    """float16 bits of x, rounded to nearest even by LLVM's fptrunc (overflow to inf, subnormals kept); from
    float32 only (from float64 LLVM calls a runtime function numba does not link)."""
    if x == types.float32:
        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return types.uint16(x), codegen


# Without F16C (a generic x86-64 target: NUMBA_CPU_NAME=generic) LLVM lowers fpext/fptrunc of half to
# compiler-rt calls that numba does not link (a call to nothing: the process crashes); the conversions are
# then done in integer arithmetic, rounding as fptrunc does (numpy's npy_floatbits_to_halfbits).
@intrinsic
def _f32_of_bits(typingctx, b):
    """The float32 whose bits are the low 32 of the integer b (numba widens uint32 arithmetic to 64 bits)."""
    if isinstance(b, types.Integer):
        def codegen(context, builder, sig, args):
            v = args[0]
            if b.bitwidth != 32:
                v = builder.trunc(v, ir.IntType(32)) if b.bitwidth > 32 else builder.zext(v, ir.IntType(32))
            return builder.bitcast(v, ir.FloatType())
        return types.float32(b), codegen


@intrinsic
def _bits_of_f32(typingctx, x):
    if x == types.float32:
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(x), codegen


@njit(inline="always", **_JIT_OPTS)
def _widen_f16_soft(u):
    h = np.uint32(u)
    sign, e, m = (h & np.uint32(0x8000)) << np.uint32(16), (h >> np.uint32(10)) & np.uint32(0x1F), h & np.uint32(0x3FF)
    if e == 0:  # zero or subnormal: m * 2^-24, exact in float32
        v = np.float32(m) * np.float32(5.9604644775390625e-08)
        return -v if sign else v
    if e == 31:  # inf or NaN
        return _f32_of_bits(sign | np.uint32(0x7F800000) | (m << np.uint32(13)))
    return _f32_of_bits(sign | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13)))


@njit(inline="always", **_JIT_OPTS)
def _narrow_f16_soft(x):
    f = _bits_of_f32(np.float32(x))
    sign = np.uint16((f & np.uint32(0x80000000)) >> np.uint32(16))
    fe = f & np.uint32(0x7F800000)
    if fe >= np.uint32(0x47800000):  # overflow, inf or NaN
        sig = f & np.uint32(0x007FFFFF)
        if fe == np.uint32(0x7F800000) and sig != 0:
            return sign | np.uint16(0x7E00)  # a quiet NaN
        return sign | np.uint16(0x7C00)
    if fe <= np.uint32(0x38000000):  # a subnormal half or zero
        if fe < np.uint32(0x33000000):
            return sign
        sig = (np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))) >> (np.uint32(113) - (fe >> np.uint32(23)))
        if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            sig += np.uint32(0x1000)
        return sign | np.uint16(sig >> np.uint32(13))
    sig = f & np.uint32(0x007FFFFF)
    if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        sig += np.uint32(0x1000)
    return sign | np.uint16(((fe - np.uint32(0x38000000)) >> np.uint32(13)) + (sig >> np.uint32(13)))


def _has_f16c():
    name, features = isa.numba_target()
    flags = set(features.split(","))
    return "+f16c" in flags or not features and name != "generic"


if not _has_f16c():
    widen_f16, narrow_f16 = _widen_f16_soft, _narrow_f16_soft
