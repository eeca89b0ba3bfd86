"""RoPE frequencies: the angle table (TE's `freqs`) and the cos/sin cache (HF's), with scalings.

Feature pair j of a head (j = 0 .. R/2-1, R = rotary dim) turns at the inverse frequency

    \\theta_j = base^{-2j/R}                      (RoFormer, eq. 15)

so position m rotates it by the angle m \\theta_j. Two conventions store these angles:

- Transformer Engine (`rope_freqs`): fp32 *angles* `[S, 1, 1, R]`, one per feature:
  `cat(f, f)` for rotate-half (feature i and i + R/2 share \\theta_i), `f0 f0 f1 f1 ...` for
  interleaved (features 2j and 2j+1 share \\theta_j). The kernel takes sin/cos itself.
- Hugging Face (`rope_cos_sin`): the *cos/sin cache* `[S, R]`, already evaluated (and multiplied
  by the scaling's attention factor, which only YaRN sets).

The context-extension scalings change \\theta_j (and YaRN also the amplitude). Each is a frozen
dataclass with its formula; they match Hugging Face transformers' `modeling_rope_utils`
(`_compute_*_parameters`) operation for operation, so the fp32 tables agree bit for bit.
"""
import math
import numbers
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

__all__ = [
    "inv_freq", "rotary_dim", "rope_freqs", "rope_cos_sin",
    "LinearScaling", "NTKScaling", "DynamicNTKScaling", "Llama3Scaling", "YaRNScaling",
    "Angles", "rope_angles", "reduced_angles", "EXACT_POSITIONS",
]


# --- argument checks -------------------------------------------------------------------------

def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def _check_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a real number, got {type(base).__name__} ({base!r})")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(f"base must be a finite number > 1 (RoFormer uses 10000.0), got {base}")
    return float(base)


def _check_rot_dim(rot_dim) -> int:
    rot_dim = _check_int("rot_dim", rot_dim, 2)
    if rot_dim % 2:
        raise ValueError(f"rot_dim must be even (RoPE rotates pairs of features), got {rot_dim}")
    return rot_dim


def _default_inv_freq(rot_dim: int, base: float, device=None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # theta_j = base^(-2j/R), computed exactly as TE and HF do: fp32 exponent, fp32 pow
    # (float64 throughout for dtype=torch.float64: the frequencies the in-kernel angles use).
    return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=dtype, device=device) / rot_dim))


# --- scalings --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ScaledByFactor:
    """What the scalings that only move frequencies share: a `factor` > 0, and cos and sin left
    at amplitude 1."""

    factor: float

    def __post_init__(self):
        _check_positive("factor", self.factor)

    @property
    def attention_scaling(self) -> float:
        """Amplitude multiplying cos and sin: 1 (no change)."""
        return 1.0


@dataclass(frozen=True)
class LinearScaling(_ScaledByFactor):
    """Linear position interpolation (Chen et al. 2023, arXiv:2306.15595; kaiokendev).

    Positions are squeezed by `factor` so a model trained on L positions sees factor*L ones
    inside its trained range:

        \\theta'_j = \\theta_j / s,     s = factor

    Equivalent to TE's `seq_len_interpolation_factor` (which scales the positions instead of
    \\theta; the two differ by fp32 rounding only). Source: HF
    `_compute_linear_scaling_rope_parameters` (`inv_freq /= factor`).
    """

    def inv_freq(self, rot_dim: int, base: float, seq_len: Optional[int] = None,
                 device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R/2] scaled inverse frequencies in `dtype` (`seq_len` is unused)."""
        inv = _default_inv_freq(rot_dim, base, device, dtype)
        inv /= self.factor
        return inv


@dataclass(frozen=True)
class NTKScaling(_ScaledByFactor):
    """NTK-aware scaling (bloc97, Reddit r/LocalLLaMA 2023): change the base, not the positions.

        base' = base \\cdot s^{R/(R-2)},    \\theta'_j = base'^{-2j/R},     s = factor

    The exponent makes the lowest frequency (j = R/2 - 1) interpolated by exactly s, like
    linear scaling, while the highest (j = 0) is untouched: \\theta'_0 = 1. High frequencies,
    which resolve nearby tokens, keep their resolution. Needs R > 2. Source: the static form
    of HF's NTK scaling (`base * factor ** (dim / (dim - 2))`); see `DynamicNTKScaling` for
    the dynamic one.
    """

    def inv_freq(self, rot_dim: int, base: float, seq_len: Optional[int] = None,
                 device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R/2] inverse frequencies with the NTK base, in `dtype` (`seq_len` is unused)."""
        if rot_dim <= 2:
            raise ValueError(f"NTKScaling needs a rotary dim > 2 (exponent R/(R-2)), got {rot_dim}")
        base = base * self.factor ** (rot_dim / (rot_dim - 2))
        return _default_inv_freq(rot_dim, base, device, dtype)


@dataclass(frozen=True)
class DynamicNTKScaling(_ScaledByFactor):
    """Dynamic NTK scaling (emozilla, Reddit r/LocalLLaMA 2023): NTK with a length-driven factor.

    For a table covering L positions, L_0 = original_max_position_embeddings, s = factor:

        L' = \\max(L, L_0),   base' = base \\cdot (s L' / L_0 - (s - 1))^{R/(R-2)},
        \\theta'_j = base'^{-2j/R}

    Up to L_0 nothing changes; beyond it the base grows with the length. The table therefore
    depends on its own length: `rope_freqs(seq_len, ..., offset=o)` uses L = o + seq_len, the
    same as HF, which recomputes `inv_freq` for L = max(position_ids) + 1. Source: HF
    `_compute_dynamic_ntk_parameters`.
    """

    original_max_position_embeddings: int

    def __post_init__(self):
        super().__post_init__()
        _check_int("original_max_position_embeddings", self.original_max_position_embeddings, 1)

    def inv_freq(self, rot_dim: int, base: float, seq_len: Optional[int] = None,
                 device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R/2] inverse frequencies for a table of `seq_len` positions, in `dtype`."""
        if rot_dim <= 2:
            raise ValueError(f"DynamicNTKScaling needs a rotary dim > 2, got {rot_dim}")
        l0 = self.original_max_position_embeddings
        length = seq_len if seq_len is not None and seq_len > l0 else l0
        base = base * ((self.factor * length / l0) - (self.factor - 1)) ** (rot_dim / (rot_dim - 2))
        return _default_inv_freq(rot_dim, base, device, dtype)


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1's frequency-dependent interpolation (Meta, "The Llama 3 Herd of Models", 2024).

    With wavelength \\lambda_j = 2\\pi / \\theta_j, L_0 = original_max_position_embeddings,
    s = factor, \\alpha = low_freq_factor, \\beta = high_freq_factor:

        \\theta'_j = \\theta_j                          if \\lambda_j < L_0/\\beta   (high frequency)
        \\theta'_j = \\theta_j / s                      if \\lambda_j > L_0/\\alpha  (low frequency)
        \\theta'_j = (1-\\gamma_j) \\theta_j / s + \\gamma_j \\theta_j   otherwise,
        \\gamma_j = (L_0/\\lambda_j - \\alpha) / (\\beta - \\alpha)

    Frequencies that turn many times within the trained context are kept, those that turn less
    than once are interpolated like `LinearScaling`, and a linear blend in 1/\\lambda joins them.
    Source: HF `_compute_llama3_parameters` (Llama 3.1: factor 8, 1, 4, L_0 = 8192, base 500000).
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        _check_positive("factor", self.factor)
        _check_positive("low_freq_factor", self.low_freq_factor)
        _check_positive("high_freq_factor", self.high_freq_factor)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"high_freq_factor must be > low_freq_factor, got "
                             f"high_freq_factor={self.high_freq_factor}, "
                             f"low_freq_factor={self.low_freq_factor}")
        _check_int("original_max_position_embeddings", self.original_max_position_embeddings, 1)

    @property
    def attention_scaling(self) -> float:
        """Amplitude multiplying cos and sin: 1 (no change)."""
        return 1.0

    def inv_freq(self, rot_dim: int, base: float, seq_len: Optional[int] = None,
                 device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R/2] inverse frequencies in `dtype` (`seq_len` is unused)."""
        inv = _default_inv_freq(rot_dim, base, device, dtype)
        factor, lo, hi = self.factor, self.low_freq_factor, self.high_freq_factor
        l0 = self.original_max_position_embeddings
        low_freq_wavelen, high_freq_wavelen = l0 / lo, l0 / hi
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
        smooth = (l0 / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_llama)


@dataclass(frozen=True)
class YaRNScaling:
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension", arXiv:2309.00071).

    "NTK-by-parts" interpolation plus an attention temperature. With s = factor,
    L_0 = original_max_position_embeddings and the dimension at which pair j turns r times
    within L_0,

        d(r) = R \\ln(L_0 / (2\\pi r)) / (2 \\ln base),
        lo = \\max(\\lfloor d(\\beta_{fast}) \\rfloor, 0),  hi = \\min(\\lceil d(\\beta_{slow}) \\rceil, R-1)
        (no floor/ceil when truncate=False; hi += 0.001 if lo == hi),
        \\rho_j = clamp((j - lo) / (hi - lo), 0, 1)         (ramp over j = 0 .. R/2-1)
        \\theta'_j = (1 - \\rho_j) \\theta_j + \\rho_j \\theta_j / s

    (fast pairs, j < lo, extrapolate; slow pairs, j > hi, interpolate), and cos and sin are
    multiplied by the attention factor

        a = attention_factor if given, else
            m(s, mscale) / m(s, mscale_all_dim)   if mscale_all_dim is given (DeepSeek-V2/V3),
            m(s, mscale)                          otherwise,
        m(s, \\mu) = 0.1 \\mu \\ln s + 1 for s > 1, else 1.

    Source: HF `_compute_yarn_parameters` (defaults beta_fast=32, beta_slow=1, truncate=True).
    One difference: HF ignores `mscale` unless `mscale_all_dim` is set; here `mscale` alone
    scales the log term (the default 1.0 gives HF's value). `mscale_all_dim` and `truncate`
    are extensions beyond the API contract, with defaults that keep it.
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    attention_factor: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    truncate: bool = True

    def __post_init__(self):
        _check_positive("factor", self.factor)
        _check_int("original_max_position_embeddings", self.original_max_position_embeddings, 1)
        _check_positive("beta_fast", self.beta_fast)
        _check_positive("beta_slow", self.beta_slow)
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={self.beta_fast}, "
                             f"beta_slow={self.beta_slow}")
        _check_positive("mscale", self.mscale)
        if self.attention_factor is not None:
            _check_positive("attention_factor", self.attention_factor)
        if self.mscale_all_dim is not None:
            _check_positive("mscale_all_dim", self.mscale_all_dim)
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be a bool, got {type(self.truncate).__name__}")

    @staticmethod
    def _m(scale: float, mscale: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    @property
    def attention_scaling(self) -> float:
        """Amplitude a multiplying cos and sin (the softmax logits grow by a^2)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale_all_dim is not None:
            return float(self._m(self.factor, self.mscale) / self._m(self.factor, self.mscale_all_dim))
        return self._m(self.factor, self.mscale)

    def inv_freq(self, rot_dim: int, base: float, seq_len: Optional[int] = None,
                 device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[R/2] inverse frequencies in `dtype` (`seq_len` is unused)."""
        l0 = self.original_max_position_embeddings

        def correction_dim(num_rotations):
            return (rot_dim * math.log(l0 / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rot_dim - 1)
        if low == high:
            high += 0.001  # avoid 0/0 in the ramp, as HF does
        ramp = torch.clamp((torch.arange(rot_dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        extrapolation_weight = (1 - ramp).to(device=device, dtype=dtype)
        pos_freqs = base ** (torch.arange(0, rot_dim, 2, dtype=dtype, device=device) / rot_dim)
        inv_extrapolation = 1.0 / pos_freqs
        inv_interpolation = 1.0 / (self.factor * pos_freqs)
        return (inv_interpolation * (1 - extrapolation_weight)
                + inv_extrapolation * extrapolation_weight)


Scaling = Union[LinearScaling, NTKScaling, DynamicNTKScaling, Llama3Scaling, YaRNScaling]
_SCALINGS = (LinearScaling, NTKScaling, DynamicNTKScaling, Llama3Scaling, YaRNScaling)


def _check_scaling(scaling) -> None:
    if scaling is not None and not isinstance(scaling, _SCALINGS):
        names = ", ".join(c.__name__ for c in _SCALINGS)
        raise TypeError(f"scaling must be None or one of {names}, got {type(scaling).__name__}")


# --- public builders -------------------------------------------------------------------------

def rotary_dim(head_dim: int, rotary_percent: float = 1.0) -> int:
    """Number of rotated features R = int(head_dim * rotary_percent), as TE and HF compute it.

    Raises ValueError when rotary_percent is outside (0, 1] or R is odd or zero.
    """
    head_dim = _check_int("head_dim", head_dim, 2)
    if isinstance(rotary_percent, bool) or not isinstance(rotary_percent, numbers.Real):
        raise TypeError(f"rotary_percent must be a real number, got {type(rotary_percent).__name__}")
    if not (0 < rotary_percent <= 1):
        raise ValueError(f"rotary_percent must be in (0, 1], got {rotary_percent}")
    rot = head_dim if rotary_percent == 1 else int(head_dim * rotary_percent)
    if rot < 2 or rot % 2:
        raise ValueError(f"rotary dim int(head_dim * rotary_percent) = int({head_dim} * "
                         f"{rotary_percent}) = {rot} must be even and >= 2 (RoPE rotates pairs); "
                         "choose another rotary_percent")
    return rot


def inv_freq(rot_dim: int, base: float = 10000.0, scaling: Optional[Scaling] = None, *,
             seq_len: Optional[int] = None, device=None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse frequencies theta_j = base^(-2j/R), j = 0..R/2-1, changed by `scaling`.

    Args:
        rot_dim: R, the number of rotated features (even).
        base: the RoPE base (10000 in RoFormer, 500000 in Llama 3).
        scaling: None or one of the scaling dataclasses.
        seq_len: table length, used only by `DynamicNTKScaling`.
        device: where to build the tensor.
        dtype: torch.float32 (the default: the same bits as TE and HF) or torch.float64 (the
            same formula in float64, as the in-kernel angles of `rope_angles` use).

    Returns:
        [R/2] in `dtype`.
    """
    rot_dim = _check_rot_dim(rot_dim)
    base = _check_base(base)
    _check_scaling(scaling)
    if seq_len is not None:
        _check_int("seq_len", seq_len, 0)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    if scaling is None:
        return _default_inv_freq(rot_dim, base, device, dtype)
    return scaling.inv_freq(rot_dim, base, seq_len=seq_len, device=device, dtype=dtype)


def _angles(seq_len, head_dim, base, rotary_percent, interleaved, scaling, offset, device):
    seq_len = _check_int("seq_len", seq_len, 0)
    offset = _check_int("offset", offset, 0)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
    rot = rotary_dim(head_dim, rotary_percent)
    # Computed on the CPU and moved: pow/exp differ in the last bit between devices, and a
    # table must have the same bits wherever it is built (a GPU run checked against a CPU one).
    inv = inv_freq(rot, base, scaling, seq_len=offset + seq_len)                       # [R/2]
    pos = torch.arange(seq_len, dtype=torch.float32) + offset                          # [S]
    f = torch.outer(pos, inv)                                                          # [S, R/2]
    if interleaved:
        f = torch.stack((f, f), dim=-1).reshape(seq_len, rot)      # f0 f0 f1 f1 ...
    else:
        f = torch.cat((f, f), dim=-1)                              # f0 .. f_{R/2-1} f0 ..
    return f.to(device) if device is not None else f


def rope_freqs(seq_len: int, head_dim: int, *, base: float = 10000.0,
               rotary_percent: float = 1.0, interleaved: bool = False,
               scaling: Optional[Scaling] = None, offset: int = 0,
               device=None) -> torch.Tensor:
    """The angle table in Transformer Engine's convention: `[seq_len, 1, 1, R]` float32.

    Row m holds the angles (m + offset) * theta for every rotated feature: `cat(f, f)` for
    rotate-half, `f0 f0 f1 f1 ...` for interleaved. Equals TE 2.x
    `RotaryPositionEmbedding(head_dim, rotary_percent, rotary_base=base,
    interleaved=interleaved)(seq_len, offset)` bit for bit (same fp32 operations).

    Angles carry no amplitude: for YaRN use `rope_cos_sin`, or scale the attention logits by
    `scaling.attention_scaling ** 2` yourself.
    """
    emb = _angles(seq_len, head_dim, base, rotary_percent, interleaved, scaling, offset, device)
    return emb.reshape(emb.shape[0], 1, 1, emb.shape[1])


def rope_cos_sin(seq_len: int, head_dim: int, *, base: float = 10000.0,
                 rotary_percent: float = 1.0, interleaved: bool = False,
                 scaling: Optional[Scaling] = None, offset: int = 0,
                 dtype: torch.dtype = torch.float32,
                 device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The cos/sin cache in Hugging Face's convention: `(cos, sin)`, each `[seq_len, R]`.

    cos = cos(angles) * a, sin = sin(angles) * a, computed in fp32 and rounded once to `dtype`,
    where a = `scaling.attention_scaling` (1 except for YaRN). Equals HF's
    `*RotaryEmbedding.forward` for positions offset .. offset+seq_len-1; with
    `interleaved=True` each value is repeated pairwise (GPT-J layout) instead.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    emb = _angles(seq_len, head_dim, base, rotary_percent, interleaved, scaling, offset, device)
    a = 1.0 if scaling is None else scaling.attention_scaling
    return (emb.cos() * a).to(dtype), (emb.sin() * a).to(dtype)


# --- angles computed in the kernel -----------------------------------------------------------
#
# A table stores m * theta_j rounded to fp32: at position m ~ 2^24 its ulp is ~1 radian, and
# the fp32 theta_j itself is off by up to 2^-24 of its value, which m multiplies. `Angles`
# stores no angle: the kernel computes each one from the token's integer position m and the
# frequency, exactly. theta_j / (2 pi), the fraction of a turn pair j advances per position, is
# kept as a 96-bit fixed-point number T_j (from the float64 theta_j, with 2 pi known to 256
# bits), so that
#
#     m theta_j mod 2 pi  =  2 pi * ((m T_j) mod 2^96) / 2^96
#
# and (m T_j) mod 2^96 is integer arithmetic: the kernel's 64-bit products wrap modulo 2^64,
# which is the range reduction itself. Read as a signed number it is the angle in [-pi, pi).
# T_j's rounding moves the angle by at most m 2^-97 turns (2^-66 turns for m < 2^31), so the
# reduced angle is converted to fp32 (via fp64) with one rounding: within an fp32 ulp of the
# exact value at any position the kernel accepts.

EXACT_POSITIONS = 2**31 - 1   # in-kernel angles take positions 0 .. 2^31 - 2 (int32 in the kernel)
_TURN_BITS = 96               # fraction of a turn per position: a 64-bit word + a 32-bit word
_PI_BITS = 256


def _two_pi_fixed(bits: int = _PI_BITS) -> int:
    """round(2 pi * 2^bits), from Machin's formula pi = 16 atan(1/5) - 4 atan(1/239) in integers."""
    guard = 32
    one = 1 << (bits + guard)

    def atan_inv(x: int) -> int:   # atan(1/x) * one, each term truncated (error < 1 per term)
        total = term = one // x
        x2, n, sign = x * x, 1, -1
        while term:
            term //= x2
            n += 2
            total += sign * (term // n)
            sign = -sign
        return total
    two_pi = 2 * (16 * atan_inv(5) - 4 * atan_inv(239))
    return (two_pi + (1 << (guard - 1))) >> guard


_TWO_PI = _two_pi_fixed()


def _turn_words(inv: torch.Tensor) -> torch.Tensor:
    """[R/2] frequencies (radians per position, float64) -> [R] int64: T_j = round(theta_j / 2pi
    * 2^96) mod 2^96 as hi_j = T_j >> 32 (64 bits, two's complement) at j and lo_j = T_j mod 2^32
    at R/2 + j."""
    hi, lo = [], []
    for f in inv.tolist():
        n, d = float(f).as_integer_ratio()                 # exact: theta = n / d
        num, den = n << (_TURN_BITS + _PI_BITS), d * _TWO_PI
        t = ((2 * num + den) // (2 * den)) % (1 << _TURN_BITS)   # nearest integer, mod 2^96
        h = t >> 32
        hi.append(h - (1 << 64) if h >= 1 << 63 else h)
        lo.append(t & 0xFFFFFFFF)
    return torch.tensor(hi + lo, dtype=torch.int64)


def reduced_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """The exact angles m theta_j reduced to [-pi, pi), rounded once to float64: [N, R/2].

    A host-side reference (Python integers: theta_j as the exact value of its float, 2 pi to
    256 bits), for checking kernels. Plain float64 is not enough at long positions: m * theta in
    float64 is off by up to 2^-29 radians at m = 2^24 before any reduction.

    Args:
        positions: [N] integer positions.
        inv_freq: [R/2] frequencies theta_j (float32 or float64; its exact values are used).
    """
    if positions.dim() != 1 or positions.dtype.is_floating_point or positions.is_complex():
        raise TypeError(f"positions must be a 1-D integer tensor, got {positions.dtype} "
                        f"{tuple(positions.shape)}")
    if inv_freq.dim() != 1 or inv_freq.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"inv_freq must be a 1-D float32 or float64 tensor, got {inv_freq.dtype} "
                        f"{tuple(inv_freq.shape)}")
    fracs = [float(f).as_integer_ratio() for f in inv_freq.tolist()]
    out = []
    for m in positions.tolist():
        row = []
        for n, d in fracs:
            den = d * _TWO_PI
            r = (m * n << _PI_BITS) % den                  # m theta / 2pi mod 1, times den
            if 2 * r >= den:
                r -= den                                   # centred: [-1/2, 1/2) turn
            row.append(r * _TWO_PI / (den << _PI_BITS))    # correctly rounded int division
        out.append(row)
    return torch.tensor(out, dtype=torch.float64).reshape(len(out), len(fracs))


class Angles:
    """RoPE angles the kernel computes itself from each token's position: no table is read.

    Pass it as `apply_rope(x, angles=...)` (or `apply_rope_qk`) instead of a `freqs` or cos/sin
    table. Every position option works as with a table (position_ids, start_positions,
    cu_seqlens, context parallelism), for positions 0 <= m < 2^31 - 1; the pairing (rotate-half
    or interleaved) is the call's `interleaved` option, so one `Angles` serves both. The kernel
    reduces m theta_j modulo 2 pi exactly (see above) and multiplies cos and sin by
    `attention_scaling` (YaRN's amplitude), forward and backward.

    Attributes:
        inv_freq: [R/2] float64, theta_j (the exact values of the tensor given).
        attention_scaling: the amplitude multiplying cos and sin.
        turns: [R] int64, theta_j / (2 pi) in 96-bit fixed point (what the kernel reads).
        amplitude: [1] float64, attention_scaling as a tensor (what the kernel reads).
    """
    __slots__ = ("inv_freq", "attention_scaling", "turns", "amplitude")

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0):
        if not isinstance(inv_freq, torch.Tensor):
            raise TypeError(f"inv_freq must be a tensor, got {type(inv_freq).__name__}")
        if inv_freq.dim() != 1 or inv_freq.numel() == 0:
            raise ValueError(f"inv_freq must be [R/2] with R/2 >= 1 (one frequency per pair), "
                             f"got shape {tuple(inv_freq.shape)}")
        if inv_freq.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"inv_freq must be float32 or float64, got {inv_freq.dtype} (build it "
                            "with ropelib.frequencies.inv_freq(..., dtype=torch.float64))")
        inv = inv_freq.detach().to(dtype=torch.float64)
        if not bool(torch.isfinite(inv).all()):
            raise ValueError("inv_freq must be finite")
        self.attention_scaling = _check_positive("attention_scaling", attention_scaling)
        self.inv_freq = inv
        self.turns = _turn_words(inv.cpu()).to(inv.device)
        self.amplitude = torch.tensor([self.attention_scaling], dtype=torch.float64,
                                      device=inv.device)

    @property
    def rot_dim(self) -> int:
        """R, the number of rotated features (two per frequency)."""
        return 2 * self.inv_freq.shape[0]

    @property
    def device(self) -> torch.device:
        return self.turns.device

    def to(self, device) -> "Angles":
        """The same angles with their tensors on `device`."""
        moved = object.__new__(Angles)
        moved.attention_scaling = self.attention_scaling
        for name in ("inv_freq", "turns", "amplitude"):
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    def __repr__(self) -> str:
        return (f"Angles(rot_dim={self.rot_dim}, attention_scaling={self.attention_scaling}, "
                f"device={self.device})")


def rope_angles(head_dim: int, *, base: float = 10000.0, rotary_percent: float = 1.0,
                scaling: Optional[Scaling] = None, seq_len: Optional[int] = None,
                device=None) -> Angles:
    """`Angles` for `apply_rope(x, angles=...)`: the frequencies of `inv_freq(..., scaling)` in
    float64 and the scaling's attention factor (1 except for YaRN).

    Args:
        head_dim, rotary_percent: as for `rope_freqs` (R = rotary_dim(head_dim, rotary_percent)).
        base: the RoPE base.
        scaling: None or one of the scaling dataclasses.
        seq_len: the length `DynamicNTKScaling` scales for (HF: max position + 1); unused by
            the others.
        device: where the kernel will run.
    """
    rot = rotary_dim(head_dim, rotary_percent)
    inv = inv_freq(rot, base, scaling, seq_len=seq_len, dtype=torch.float64)
    a = 1.0 if scaling is None else scaling.attention_scaling
    angles = Angles(inv, a)
    return angles.to(device) if device is not None else angles
