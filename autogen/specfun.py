"""More branch-free math for generated kernels: trigonometric, hyperbolic, error and gamma functions.

Built like autogen.mathlib (selects instead of branches, polynomials, bit tricks; LLVM vectorizes
a loop over any of them) and from its exp/log/log1p/erf pieces. The float64 code is accurate to a
few ulp (tests: within 1e-14 relative); float32 goes through the float64 code and is rounded once
(within 1 ulp), except cosh, sinh, exp2, remainder and floordiv, which have float32 code of their
own. Polynomials are Chebyshev interpolants (autogen/_fit_specfun.py, mpmath: for 1e-16).

trigamma follows torch's own algorithm (the gradient of digamma must match torch's, whose
asymptotic series stops early: up to ~5e-9 from the true value).
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .mathlib import (CONST, EXACT_FLAGS, IMPLS, KERNEL_FASTMATH, cody_waite, fused_intrinsic, fused_mul_add, horner, ldexp2,
                      llvm_call, logsplit, pow2, round_even, strict_add, two_sum_exact)

__all__ = ['cosh', 'sinh', 'tan', 'asin', 'acos', 'atan', 'atan2', 'asinh', 'acosh', 'atanh', 'erfc', 'erfinv',
           'exp2', 'log2', 'log10', 'lgamma', 'digamma', 'trigamma', 'hypot', 'logaddexp', 'remainder',
           'floordiv']

# No 'arcp' here: these functions divide by values that may be 0 or inf (atanh(1), cot at pi/2),
# where a reciprocal estimate gives NaN.
_JIT_OPTS = dict(fastmath=KERNEL_FASTMATH, error_model='numpy')
# Inlined by LLVM into the calling loop (alwaysinline) whatever their size, so that the loop vectorizes
_INLINE = dict(_JIT_OPTS, forceinline=True)


_fma_exact = fused_intrinsic('llvm.fma')  # rounded once (always fused), for error-free products


@intrinsic
def _clenshaw(typingctx, u, coefs):
    """sum of c_k T_k(u) (Chebyshev polynomials), coefficients highest degree first, c_0 last."""
    if isinstance(u, types.Float) and isinstance(coefs, types.UniTuple) and coefs.dtype == u:
        def codegen(context, builder, sig, args):
            uv = args[0]
            two_u = builder.fadd(uv, uv, flags=EXACT_FLAGS)
            b1 = b2 = ir.Constant(uv.type, 0.0)
            for i in range(coefs.count - 1):
                c = builder.extract_value(args[1], i)
                b1, b2 = llvm_call(builder, 'llvm.fmuladd', uv.type,
                                    [two_u, b1, builder.fsub(c, b2, flags=EXACT_FLAGS)]), b1
            c0 = builder.extract_value(args[1], coefs.count - 1)
            return llvm_call(builder, 'llvm.fmuladd', uv.type, [uv, b1, builder.fsub(c0, b2, flags=EXACT_FLAGS)])
        return u(u, coefs), codegen


def _two_over_pi_chunks(count):
    """2/pi = sum of C_i 2**(-24 (i + 1)): the 24-bit integers C_i, from pi in integer arithmetic."""
    bits = 24 * count + 64
    one = 1 << (bits + 16)

    def atan_inv(n):  # atan(1/n) * one, by its series
        total, term, k, n2 = 0, one // n, 1, n * n
        while term:
            total += term // k if (k // 2) % 2 == 0 else -(term // k)
            term //= n2
            k += 2
        return total
    pi = 16 * atan_inv(5) - 4 * atan_inv(239)          # Machin's formula, scaled by `one`
    frac = (2 * one << bits) // pi                      # 2/pi * 2**bits
    return tuple(float((frac >> (bits - 24 * (i + 1))) & 0xFFFFFF) for i in range(count))


# -- constants (float64; polynomials highest degree first) ---------------------------------------
_PIO2 = (1.5707963267948966, 6.123233995736766e-17)         # pi/2 as hi + lo
_PI = (3.141592653589793, 1.2246467991473532e-16)
_PIO2_CW = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487111665e-21, 8.4784276603689e-32)  # 33+33+33+53 bits
_ATAN_BASE = ((0.4636476090008061, 2.2698777452961687e-17),  # atan(1/2), atan(1), atan(3/2), as hi + lo
              (0.7853981633974483, 3.061616997868383e-17),
              (0.982793723247329, 1.3903311031230998e-17))
# atan(t) = t + t^3 P(t^2), |t| <= 7/16
_ATAN_P = (-0.017547235157290005, 0.03782521866106712, -0.05033942776485848, 0.05847724720645106,
           -0.06663239299107136, 0.07692087348767168, -0.09090900195560148, 0.11111110900560475,
           -0.1428571428314864, 0.1999999999998777, -0.33333333333333326)
# asin(s) = s + s^3 P(s^2), s <= 1/2
_ASIN_P = (0.028757851367421566, -0.014851887071247204, 0.01740087944269402, 0.005457506718640358,
           0.01032281435018578, 0.011479177415184906, 0.013971212973552933, 0.017352392720869973,
           0.02237217294214989, 0.030381944138531247, 0.04464285714635543, 0.07499999999998433,
           0.16666666666666669)
# tan(r) = r + r^3 P(r^2), |r| <= pi/4
_TAN_P = (8.48334725267473e-06, -1.83153428020867e-05, 3.651618193613342e-05, -1.1013613221811344e-05,
          5.558784710570148e-05, 8.998520298342289e-05, 0.000241226353512688, 0.0005895756061544555,
          0.0014559027390503058, 0.0035921209805615966, 0.008863236003485818, 0.02186948851707438,
          0.05396825396865546, 0.13333333333333, 0.3333333333333333)
# erfc(z) = 2/(2 + z) exp(-z^2 + f(u)), u = (2 - z)/(2 + z), z >= 0: f's Chebyshev series (c_29 .. c_0)
_ERFC_CHEB = tuple(reversed((
    -0.6513268598908547, 0.6419697923564902, 0.019476473204185836, -0.009561514786808632,
    -0.0009465953444820369, 0.00036683949785276145, 4.252332480690777e-05, -2.0278578112534242e-05,
    -1.6242900046470256e-06, 1.3036558355805232e-06, 1.5626441722066142e-08, -8.523809591492654e-08,
    6.5290544390988515e-09, 5.059343495551469e-09, -9.91364156493033e-10, -2.273651222931836e-10,
    9.646791102015527e-11, 2.3940380830391146e-12, -6.886027526497553e-12, 8.944879273090725e-13,
    3.130921399342958e-13, -1.1270822361367252e-13, 3.810905255189232e-16, 7.106097613609237e-15,
    -1.5230282014571043e-15, -9.457494571291233e-17, 1.210237189224279e-16, -2.816663087747177e-17,
    5.003005559445902e-20, 2.3281042579529253e-18)))
# digamma(y) = (y - x0) R(y) on [1, 2], x0 its root; R's Chebyshev series in u = 2y - 3
_DIGAMMA_X0 = (1.4616321449683622, 9.549995429965697e-17)
_DIGAMMA_CHEB = tuple(reversed((
    0.983570260441567, -0.2270640863346444, 0.03336889902393011, -0.005320077271596548,
    0.0008788656937820505, -0.00014773492650606044, 2.5060543468359146e-05, -4.2721034029993324e-06,
    7.302769272465923e-07, -1.2502886813559594e-07, 2.1425009322359472e-08, -3.673295918565179e-09,
    6.299717236108931e-10, -1.080593028883266e-10, 1.853735192053638e-11, -3.18023536582553e-12,
    5.456147570322795e-13, -9.360993131036438e-14, 1.606064636295075e-14, -2.7555431377438815e-15,
    4.727736178601912e-16, -8.11148420346509e-17, 1.391707769474154e-17, -2.3877901082188625e-18)))
# lgamma(y) = (y - 1)(y - 2) R(y) on [1, 3]; R's Chebyshev series in u = y - 2
_LGAMMA_CHEB = tuple(reversed((
    0.44148902545501423, -0.11119580321752523, 0.01951044826068884, -0.003922461463025264,
    0.0008478989895953857, -0.00019153855341365593, 4.454470184975607e-05, -1.05728743735943e-05,
    2.5474336873408417e-06, -6.208535880776316e-07, 1.5268677399071546e-07, -3.782637660291326e-08,
    9.428100823624284e-09, -2.361999702184645e-09, 5.943541905817546e-10, -1.501312977072867e-10,
    3.8050196458110534e-11, -9.672485299656325e-12, 2.465348198355661e-12, -6.298868140791711e-13,
    1.6128460030283787e-13, -4.137949206814042e-14, 1.0635701227757898e-14, -2.7382420786652826e-15,
    7.060670507214892e-16, -1.8232177141662118e-16, 4.714169006756272e-17, -1.2204107319639856e-17,
    3.1630451661790255e-18, -8.206746544166728e-19)))
# Stirling's series: sum of B_2k / (2k (2k - 1) x^(2k - 1)), k = 7 .. 1, in z = 1/x^2
_LGAMMA_S = (1 / 156, -691 / 360360, 1 / 1188, -1 / 1680, 1 / 1260, -1 / 360, 1 / 12)
# digamma's asymptotic series: sum of B_2k / (2k x^2k), k = 7 .. 1, in z = 1/x^2
_DIGAMMA_A = (1 / 12, -691 / 32760, 1 / 132, -1 / 240, 1 / 252, -1 / 120, 1 / 12)
# erfinv: torch's first guesses (Pavlis' rational functions), then Halley steps
_ERFINV_A = (-0.140543331, 0.914624893, -1.645349621, 0.886226899)
_ERFINV_B = (0.012229801, -0.329097515, 1.442710462, -2.118377725, 1.0)
_ERFINV_C = (1.641345311, 3.429567803, -1.624906493, -1.970840454)
_ERFINV_D = (1.637067800, 3.543889200, 1.0)
_TWO_OVER_PI = np.array(_two_over_pi_chunks(52))


def _build_native(bits):
    """The functions with code of their own for each float width."""
    dt = np.float32 if bits == 32 else np.float64
    K = {k: (tuple(dt(c) for c in v) if isinstance(v, tuple) else dt(v)) for k, v in CONST[bits].items()}
    impl = IMPLS[bits]
    reduce_exp, expm1 = impl['_reduce_exp'], impl['expm1']
    ZERO, QUARTER, HALF, ONE, TWO = dt(0), dt(0.25), dt(0.5), dt(1), dt(2)
    EXP_P = K['EXP_P']
    LN2 = dt(math.log(2))
    LN2_LO = dt(math.log(2) - float(LN2))
    # cosh/sinh: past COSH_HI e^a/2 is inf; from SINH_SPLIT on e^-a/2 is below half an ulp of sinh
    COSH_HI, SINH_SPLIT = (dt(90.0), dt(12.0)) if bits == 32 else (dt(711.0), dt(22.0))
    EXP2_HI, EXP2_LO = (dt(130.0), dt(-152.0)) if bits == 32 else (dt(1030.0), dt(-1080.0))
    jit = njit(**_INLINE)

    @jit
    def cosh(x):
        a = abs(x)
        a = COSH_HI if a > COSH_HI else a
        n, p = reduce_exp(a)
        h = ldexp2(ONE + p, n - ONE)              # e^a / 2, no overflow before cosh's own
        return h + QUARTER / h

    @jit
    def sinh(x):
        a = abs(x)
        a = COSH_HI if a > COSH_HI else a
        t = expm1(SINH_SPLIT if a > SINH_SPLIT else a)
        u = t / (t + ONE)                           # 1 - e^-a
        small = HALF * (TWO * t - t * u)            # a < 1: (t + t/(t+1))/2 without cancellation
        mid = HALF * (t + u)
        n, p = reduce_exp(a)
        big = ldexp2(ONE + p, n - ONE)
        r = small if a < ONE else (mid if a < SINH_SPLIT else big)
        return math.copysign(r, x)

    @jit
    def exp2(x):
        x = EXP2_HI if x > EXP2_HI else x
        x = EXP2_LO if x < EXP2_LO else x
        n = round_even(x)
        r = x - n                                   # exact
        t = r * LN2
        e = _fma_exact(r, LN2, -t) + r * LN2_LO     # t + e = r ln2 to well below an ulp
        p = fused_mul_add(t * t, horner(t, EXP_P), t)        # expm1(t)
        return ldexp2(ONE + fused_mul_add(e, ONE + p, p), n)

    @jit
    def remainder(a, b):
        # torch's (and Python's) remainder: fmod, moved by b when it has the other sign
        mod = np.fmod(a, b)
        return mod + b if (mod != ZERO) & ((b < ZERO) != (mod < ZERO)) else mod

    @jit
    def floordiv(a, b):
        # torch's div(a, b, rounding_mode='floor'): the floor of the exact quotient (Python's //)
        mod = np.fmod(a, b)
        div = (a - mod) / b
        div = div - ONE if (mod != ZERO) & ((b < ZERO) != (mod < ZERO)) else div
        fl = np.floor(div)
        fl = fl + ONE if div - fl > HALF else fl
        fl = fl if div != ZERO else math.copysign(ZERO, a / b)
        return a / b if b == ZERO else fl

    return dict(cosh=cosh, sinh=sinh, exp2=exp2, remainder=remainder, floordiv=floordiv)


def _build64():
    """float64 code of the other functions."""
    dt = np.float64
    K = {k: (tuple(dt(c) for c in v) if isinstance(v, tuple) else dt(v)) for k, v in CONST[64].items()}
    impl = IMPLS[64]
    exp, log, log1p, erf, log_tail = impl['exp'], impl['log'], impl['log1p'], impl['erf'], impl['_log_tail']
    log1pexp = impl['log1pexp']
    ZERO, QUARTER, HALF, ONE, TWO, THREE, TEN = 0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 10.0
    INF, NAN = np.inf, np.nan
    LOG2E, LN2_HI, LN2_LO, EXP_P = 1 / math.log(2), K['LN2_HI'], K['LN2_LO'], K['EXP_P']
    TINY, SUB_SCALE, SUB_K = K['TINY'], K['SUB_SCALE'], K['SUB_K']
    LN2 = math.log(2)
    PIO2_HI, PIO2_LO = _PIO2
    PI_HI, PI_LO = _PI
    P1, P2, P3, P3T = _PIO2_CW
    INV_PIO2, MEDIUM = 2 / math.pi, 2.0 ** 20 * math.pi / 2     # Cody-Waite below MEDIUM, Payne-Hanek above
    (A1H, A1L), (A2H, A2L), (A3H, A3L) = _ATAN_BASE
    ATAN_P, ASIN_P, TAN_P = _ATAN_P, _ASIN_P, _TAN_P
    ERFC_CHEB, ERFC_MAX = _ERFC_CHEB, 30.0                      # erfc(30) underflows to 0
    X0_HI, X0_LO = _DIGAMMA_X0
    DIGAMMA_CHEB, DIGAMMA_A = _DIGAMMA_CHEB, _DIGAMMA_A
    LGAMMA_CHEB, LGAMMA_S, HALF_LOG_2PI = _LGAMMA_CHEB, _LGAMMA_S, 0.5 * math.log(2 * math.pi)
    TINY_X = 2.0 ** -54
    EA, EB, EC, ED = _ERFINV_A, _ERFINV_B, _ERFINV_C, _ERFINV_D
    TWO_SQRTPI = 2 / math.sqrt(math.pi)
    INV_LN2_HI, INV_LN2_LO = 1.4426950408889634, 2.0355273740931033e-17
    INV_LN10_HI, INV_LN10_LO = 0.4342944819032518, 1.098319650216765e-17
    LOG10_2_HI, LOG10_2_LO = 0.3010299955494702, 1.1451100898021838e-10  # hi has 32 bits: k*hi exact
    TWO28 = 2.0 ** 28
    PI2 = math.pi ** 2
    TWO52, TWO26, TWO_M26 = 2.0 ** 52, 2.0 ** 26, 2.0 ** -26
    Q50, Q98 = 2.0 ** -50, 2.0 ** -98
    TABLE = _TWO_OVER_PI
    jit = njit(**_INLINE)

    # -- logarithms in other bases: log(x) = k ln2 + log(1 + f), the k term exact ----------------
    @jit
    def log_kf(x):
        """(k, log(1 + f)) with x = 2**k (1 + f); log(1 + f) carries log's special values."""
        sub = x < TINY
        k, m = logsplit(x * SUB_SCALE if sub else x)
        k = k - SUB_K if sub else k
        return k, log_tail(x, ZERO, m - ONE, ZERO)

    @jit
    def log2(x):
        k, lf = log_kf(x)
        return k + fused_mul_add(lf, INV_LN2_HI, lf * INV_LN2_LO)

    @jit
    def log10(x):
        k, lf = log_kf(x)
        return fused_mul_add(k, LOG10_2_HI, fused_mul_add(lf, INV_LN10_HI, fused_mul_add(k, LOG10_2_LO, lf * INV_LN10_LO)))

    # -- exp of a double-double argument (erfc's exp(-z^2 + f)) ----------------------------------
    @jit
    def exp_dd(hi, lo):
        n = round_even((hi + lo) * LOG2E)
        r = strict_add(cody_waite(hi, n, LN2_HI, LN2_LO), lo)
        return ldexp2(ONE + fused_mul_add(r * r, horner(r, EXP_P), r), n)

    # -- inverse trigonometric -------------------------------------------------------------------
    @jit
    def atan_pos(a):
        """atan(a) for a >= 0 (or NaN): t = (a - c)/(1 + ac) for the nearest c of 0, 1/2, 1, 3/2, inf
        (numerators exact), atan(a) = atan(c) + atan(t), |t| <= 7/16."""
        i1, i2, i3, i4 = a >= 0.4375, a >= 0.6875, a >= 1.1875, a >= 2.4375
        num = -ONE if i4 else (a - 1.5 if i3 else (a - ONE if i2 else (TWO * a - ONE if i1 else a)))
        den = a if i4 else (fused_mul_add(1.5, a, ONE) if i3 else (a + ONE if i2 else (TWO + a if i1 else ONE)))
        hi = PIO2_HI if i4 else (A3H if i3 else (A2H if i2 else (A1H if i1 else ZERO)))
        lo = PIO2_LO if i4 else (A3L if i3 else (A2L if i2 else (A1L if i1 else ZERO)))
        t = num / den
        z = t * t
        return strict_add(hi, strict_add(lo, fused_mul_add(t * z, horner(z, ATAN_P), t)))

    @jit
    def atan(x):
        return math.copysign(atan_pos(abs(x)), x)

    @jit
    def atan2(y, x):
        ax, ay = abs(x), abs(y)
        swap = ay > ax
        num = ax if swap else ay
        den = ay if swap else ax
        r = num / den
        r = ZERO if den == ZERO else r              # atan2(+-0, +-0)
        r = ONE if num == INF else r                # atan2(+-inf, +-inf)
        t = atan_pos(r)
        t = strict_add(PIO2_HI, -strict_add(t, -PIO2_LO)) if swap else t
        t = strict_add(PI_HI, -strict_add(t, -PI_LO)) if math.copysign(ONE, x) < ZERO else t
        t = math.copysign(t, y)
        return t if (x == x) & (y == y) else NAN

    @jit
    def asin_core(a):
        """(asin(s), big) with s = a below 1/2, sqrt((1 - a)/2) above (asin(a) = pi/2 - 2 asin(s))."""
        big = a >= HALF
        z = (ONE - a) * HALF if big else a * a      # 1 - a exact from 1/2 on
        s = np.sqrt(z) if big else a
        return fused_mul_add(s * z, horner(z, ASIN_P), s), big

    @jit
    def asin(x):
        r, big = asin_core(abs(x))
        res = strict_add(PIO2_HI, -strict_add(TWO * r, -PIO2_LO)) if big else r
        return math.copysign(res, x)

    @jit
    def acos(x):
        r, big = asin_core(abs(x))
        small = strict_add(PIO2_HI, -strict_add(math.copysign(r, x), -PIO2_LO))
        neg = strict_add(PI_HI, -strict_add(TWO * r, -PI_LO))
        return (TWO * r if x > ZERO else neg) if big else small

    # -- inverse hyperbolic: one log1p each, of an argument without cancellation ---------------
    @jit
    def asinh(x):
        a = abs(x)
        a2 = a * a
        small = a + a2 / (ONE + np.sqrt(ONE + a2))
        mid = TWO * a + ONE / (np.sqrt(a2 + ONE) + a) - ONE
        huge = a > TWO28                            # log(2a) = log1p(a - 1) + ln2
        u = small if a <= TWO else (a - ONE if huge else mid)
        return math.copysign(log1p(u) + (LN2 if huge else ZERO), x)

    @jit
    def acosh(x):
        t = x - ONE
        small = t + np.sqrt(TWO * t + t * t)
        mid = TWO * x - ONE / (x + np.sqrt(x * x - ONE)) - ONE
        huge = x > TWO28
        u = small if x <= TWO else (t if huge else mid)
        r = log1p(u) + (LN2 if huge else ZERO)
        return r if x >= ONE else NAN

    @jit
    def atanh(x):
        a = abs(x)
        d = ONE - a
        u = TWO * a + TWO * a * a / d if a < HALF else TWO * a / d
        return math.copysign(HALF * log1p(u), x)

    # -- tan: Cody-Waite reduction by pi/2 (three 33-bit parts) below 2^20 pi/2, Payne-Hanek above
    @jit
    def tan_poly(hi, lo):
        """tan(hi + lo), |hi| <= pi/4 (a little beyond is fine), lo a correction."""
        z = hi * hi
        t = fused_mul_add(hi * z, horner(z, TAN_P), hi)
        return t + lo * (ONE + t * t)

    @jit
    def split(t, q):
        """t = h + r exactly, h a multiple of q (a power of two), 0 <= r < q."""
        h = np.floor(t / q) * q
        return h, strict_add(t, -h)                       # strict_add: 'reassoc' must not fold t - h - ... together

    @jit
    def add3(acc, t):
        """acc + (t mod 4), acc an exact three-part sum (multiples of 2^-50, of 2^-98, the rest)."""
        s_hi, s_mid, s_lo = acc
        t = strict_add(t, -4.0 * np.floor(t * QUARTER))
        h, r = split(t, Q50)
        mid, lo = split(r, Q98)
        s_hi = strict_add(s_hi, h)
        return strict_add(s_hi, -4.0 * np.floor(s_hi * QUARTER)), strict_add(s_mid, mid), strict_add(s_lo, lo)

    @jit
    def chunk(acc, mhi, mlo, c, scale):
        """acc + M c scale with M = mhi 2^26 + mlo: two exact products."""
        return add3(add3(acc, mhi * c * (scale * TWO26)), mlo * c * scale)

    @jit
    def rem_pio2_large(a):
        """(n, hi, lo) with a = n pi/2 + hi + lo, for a >= 2^20: a's 53-bit mantissa M times the
        24-bit chunks of 2/pi that matter, each product exact (M split in two) and reduced modulo 4.
        The sum is kept exactly in three parts, as the fraction may cancel down to 2^-61 of the
        integer part (6381956970095103 2^797). Straight-line code: the table loads vectorize as gathers."""
        k, m = logsplit(a)
        low = m < ONE
        m = m * TWO if low else m
        k = k - ONE if low else k                   # a = 2^k m, m in [1, 2)
        mant = m * TWO52
        mhi = np.floor(mant * TWO_M26)
        mlo = strict_add(mant, -(mhi * TWO26))
        j0 = np.floor((k - 54.0) / 24.0)            # earlier chunks give multiples of 4
        j0 = ZERO if j0 < ZERO else j0
        j0 = 40.0 if j0 > 40.0 else j0
        j = int(j0)
        e = k - 76.0 - 24.0 * j0                    # chunk i weighs 2^(e - 24 i)
        acc = (ZERO, ZERO, ZERO)
        acc = chunk(acc, mhi, mlo, TABLE[j], pow2(e))
        acc = chunk(acc, mhi, mlo, TABLE[j + 1], pow2(e - 24.0))
        acc = chunk(acc, mhi, mlo, TABLE[j + 2], pow2(e - 48.0))
        acc = chunk(acc, mhi, mlo, TABLE[j + 3], pow2(e - 72.0))
        acc = chunk(acc, mhi, mlo, TABLE[j + 4], pow2(e - 96.0))
        acc = chunk(acc, mhi, mlo, TABLE[j + 5], pow2(e - 120.0))
        acc = chunk(acc, mhi, mlo, TABLE[j + 6], pow2(e - 144.0))
        s_hi, s_mid, s_lo = chunk(acc, mhi, mlo, TABLE[j + 7], pow2(e - 168.0))
        n = round_even(s_hi)
        fh, fl = two_sum_exact(strict_add(s_hi, -n), s_mid)
        fl = strict_add(fl, s_lo)
        n2 = round_even(fh)                              # s_mid may carry the fraction past 1/2
        fh, fl = two_sum_exact(strict_add(fh, -n2), fl)
        rh = fh * PIO2_HI
        rl = _fma_exact(fh, PIO2_HI, -rh) + (fh * PIO2_LO + fl * PIO2_HI)
        return n + n2, rh, rl

    @jit
    def tan(x):
        a = abs(x)
        n = round_even(a * INV_PIO2)
        r1 = a - n * P1                             # exact: n < 2^20, P1 has 33 bits
        s, e = two_sum_exact(r1, -(n * P2))
        lo = strict_add(strict_add(e, -(n * P3)), -(n * P3T))
        hi, lo = two_sum_exact(s, lo)
        nb, hb, lb = rem_pio2_large(a)
        big = a > MEDIUM
        n = nb if big else n
        hi = hb if big else hi
        lo = lb if big else lo
        t = tan_poly(hi, lo)
        odd = n * HALF != np.floor(n * HALF)
        t = -ONE / t if odd else t                  # tan(r + pi/2) = -cot(r)
        t = t * math.copysign(ONE, x)               # odd: tan(-0) = -0 too
        return t if a < INF else NAN

    @jit
    def tanpi(r):
        """tan(pi r) for |r| <= 1/2."""
        a = abs(r)
        far = a > QUARTER
        b = HALF - a if far else a                  # exact
        hi = PI_HI * b
        lo = _fma_exact(PI_HI, b, -hi) + PI_LO * b
        t = tan_poly(hi, lo)
        t = ONE / t if far else t                   # tan(pi/2 - x) = 1/tan(x)
        return math.copysign(t, r)

    # -- error functions ---------------------------------------------------------------------------
    @jit
    def erfc_pos(z):
        z = ERFC_MAX if z > ERFC_MAX else z
        d = TWO + z
        f = _clenshaw((TWO - z) / d, ERFC_CHEB)
        hi = -(z * z)
        lo = _fma_exact(-z, z, -hi)                 # -z^2 = hi + lo exactly
        return (TWO / d) * exp_dd(hi, lo + f)

    @jit
    def erfc(x):
        r = erfc_pos(abs(x))
        return r if x >= ZERO else (TWO - r if x < ZERO else r)

    @jit
    def erfinv(y):
        a = abs(y)
        w = ONE - a                                 # exact from a = 1/2 on
        z = a * a
        xc = a * horner(z, EA) / horner(z, EB)
        zt = np.sqrt(-log(w * HALF))
        xt = horner(zt, EC) / horner(zt, ED)
        x = xc if a <= 0.7 else xt
        for _ in range(2):
            # Halley on erf(x) = a, or on erfc(x) = 1 - a from 1/2 on (accurate up to a -> 1)
            g = TWO_SQRTPI * exp(-(x * x))
            d = (erf(x) - a if a <= HALF else w - erfc_pos(x)) / g
            x = x - d / fused_mul_add(x, d, ONE)
        x = INF if a == ONE else x
        x = x if a <= ONE else NAN
        return math.copysign(x, y)

    # -- gamma family -------------------------------------------------------------------------------
    @jit
    def lgamma_pos(y):
        """lgamma(y), y > 0 (or inf, NaN): (y - 1)(y - 2) R(y) on [1, 3] (exact at lgamma's zeros),
        lgamma(y + 1) - log(y) below, log of the product of a downward recurrence on [3, 10),
        Stirling's series from 10 on."""
        lt1 = y < ONE
        v = y + ONE if lt1 else y                   # (0, 1) -> (1, 2)
        prod = ONE
        for _ in range(7):                          # [3, 10) -> [2, 3): lgamma(v) = lgamma(v - 1) + log(v - 1)
            step = (v >= THREE) & (v < TEN)
            v = v - ONE if step else v
            prod = prod * v if step else prod
        vc = v if v < THREE else THREE               # the series' argument in range (unused beyond)
        f1 = y if lt1 else strict_add(vc, -ONE)           # (v - 1)(v - 2) from y itself below 1: exact
        f2 = strict_add(y, -ONE) if lt1 else strict_add(vc, -TWO)
        near = f1 * f2 * _clenshaw(vc - TWO, LGAMMA_CHEB)
        near = near - log(y) if lt1 else near + log(prod)
        iv = ONE / y
        lx = log(y)
        far = fused_mul_add(y, lx - ONE, -HALF * lx) + HALF_LOG_2PI + iv * horner(iv * iv, LGAMMA_S)
        far = INF if y == INF else far
        return near if y < TEN else far

    @jit
    def lgamma(x):
        # below 0: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x), |sin(pi r)| = 2|t| / (1 + t^2) with
        # t = tan(pi r / 2) (|r| <= 1/2 needs no reduction); +inf at the poles 0, -1, -2, ... as torch
        neg = x < ZERO
        r = lgamma_pos(ONE - x if neg else x)
        hr = HALF * (x - round_even(x))
        hi = PI_HI * hr
        t = tan_poly(hi, _fma_exact(PI_HI, hr, -hi) + PI_LO * hr)
        refl = log(PI_HI * (ONE + t * t) / (TWO * abs(t))) - r
        r = (INF if hr == ZERO else refl) if neg else r
        r = -log(abs(x)) if abs(x) < TINY_X else r  # lgamma(x) = -log|x| - gamma x + ...: the rest below an ulp
        return INF if (x == ZERO) | (x == -INF) else r

    @jit
    def digamma_pos(y):
        """digamma(y), y > 0 (or inf, NaN)."""
        lt1 = y < ONE
        y1 = y + ONE if lt1 else y
        y1 = TWO if y1 > TWO else y1
        near = strict_add(strict_add(y1, -X0_HI), -X0_LO) * _clenshaw(fused_mul_add(TWO, y1, -THREE), DIGAMMA_CHEB)
        near = near - ONE / y if lt1 else near
        s = ZERO
        v = y
        for _ in range(8):                          # digamma(v) = digamma(v + 1) - 1/v, up to v >= 10
            step = v < TEN
            s = s + (ONE / v if step else ZERO)
            v = v + ONE if step else v
        iv = ONE / v
        z = iv * iv
        far = log(v) - HALF * iv - z * horner(z, DIGAMMA_A) - s
        return near if y < TWO else far

    @jit
    def digamma(x):
        # torch's values: digamma(+-0) = -+inf, NaN at negative integers; reflection below 0
        neg = x < ZERO
        r = digamma_pos(ONE - x if neg else x)
        fr = x - round_even(x)
        r = r - PI_HI / tanpi(fr) if neg else r
        r = NAN if neg & (fr == ZERO) else r
        return -math.copysign(INF, x) if x == ZERO else r

    @jit
    def trigamma(x):
        # torch's calc_trigamma: reflection below 1/2, six recurrence steps, a short asymptotic series
        refl = x < HALF
        t = tanpi(x - round_even(x))
        res = -(PI2 * (ONE + ONE / (t * t))) if refl else ZERO    # pi^2 / sin^2(pi x)
        v = ONE - x if refl else x
        for _ in range(6):
            res = res + ONE / (v * v)
            v = v + ONE
        ixx = ONE / (v * v)
        res = res + (ONE + ONE / (TWO * v) + ixx * (ONE / 6 - ixx * (ONE / 30 - ixx * (ONE / 42)))) / v
        return -res if refl else res

    @jit
    def logaddexp(a, b):
        # torch's formula, max + log1p(exp(-|a - b|)); equal infinities are returned as they are.
        # Where the sum cancels (a result near 0 from a max near -log(2)), the error is ~1 ulp of the max
        m = a if (a > b) | (a != a) else b
        r = m + log1pexp(-abs(a - b))
        return a if (a == b) & (abs(a) == INF) else r

    @jit
    def hypot(x, y):
        ax, ay = abs(x), abs(y)
        big = ax if ax > ay else ay
        small = ay if ax > ay else ax
        r = small / big
        h = big * np.sqrt(ONE + r * r)
        h = ZERO if big == ZERO else h
        h = h if (x == x) & (y == y) else NAN
        return INF if (ax == INF) | (ay == INF) else h   # hypot(inf, nan) = inf

    return dict(log2=log2, log10=log10, atan=atan, atan2=atan2, asin=asin, acos=acos, asinh=asinh,
                acosh=acosh, atanh=atanh, tan=tan, erfc=erfc, erfinv=erfinv, lgamma=lgamma, digamma=digamma,
                trigamma=trigamma, hypot=hypot, logaddexp=logaddexp)


def _build():
    native32, native64, wide = _build_native(32), _build_native(64), _build64()
    jit = njit(**_INLINE)
    impls32 = dict(native32)
    for name, f in wide.items():                    # float32: the float64 code, rounded once
        if name == 'hypot':
            @jit
            def hypot32(x, y):                      # float32 squares cannot overflow in float64
                xd, yd = np.float64(x), np.float64(y)
                h = np.float32(np.sqrt(xd * xd + yd * yd))
                return np.float32(np.inf) if (abs(x) == np.inf) | (abs(y) == np.inf) else h
            impls32[name] = hypot32
        elif name in _ARITY2:
            impls32[name] = jit(lambda x, y, f=f: np.float32(f(np.float64(x), np.float64(y))))
        else:
            impls32[name] = jit(lambda x, f=f: np.float32(f(np.float64(x))))
    return impls32, dict(native64, **wide)


_ARITY2 = ('atan2', 'hypot', 'logaddexp', 'remainder', 'floordiv')
_NEW32, _NEW64 = _build()
IMPLS[32].update(_NEW32)
IMPLS[64].update(_NEW64)


def _public(name):
    arity = 2 if name in _ARITY2 else 1

    def stub(*args):
        # Python-level fallback (scalars only); inside numba the overload below is used instead
        bits = 32 if all(isinstance(a, np.float32) for a in args) else 64
        cast = np.float32 if bits == 32 else float
        return IMPLS[bits][name](*[cast(a) for a in args])
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = '%s(%s) for float32/float64 scalars inside numba kernels.' % (name, ', '.join('xy'[:arity]))

    def pick(args):
        floats = [a for a in args if isinstance(a, types.Float)]
        if len(args) != arity or not all(isinstance(a, (types.Float, types.Integer, types.Boolean)) for a in args):
            return None
        return 32 if floats and all(a.bitwidth == 32 for a in floats) else 64

    if arity == 1:
        @overload(stub, jit_options=_INLINE)
        def _ov(x):
            bits = pick((x,))
            if bits:
                impl, cast = IMPLS[bits][name], (np.float32 if bits == 32 else np.float64)
                return lambda x: impl(cast(x))
    else:
        @overload(stub, jit_options=_INLINE)
        def _ov(x, y):
            bits = pick((x, y))
            if bits:
                impl, cast = IMPLS[bits][name], (np.float32 if bits == 32 else np.float64)
                return lambda x, y: impl(cast(x), cast(y))
    return stub


for _name in __all__:
    globals()[_name] = _public(_name)
