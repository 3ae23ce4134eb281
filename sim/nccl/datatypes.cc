#include "datatypes.h"

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ncclsim {

size_t dataTypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* dataTypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "half";
    case ncclFloat32:
      return "float";
    case ncclFloat64:
      return "double";
    case ncclBfloat16:
      return "bfloat16";
    case ncclFloat8e4m3:
      return "fp8e4m3";
    case ncclFloat8e5m2:
      return "fp8e5m2";
    default:
      return "invalid";
  }
}

namespace {

// Rounds a non-negative finite magnitude to a binary format with `mantissaBits` stored mantissa
// bits and exponent bias `bias`, ties to even. Returns exponent<<mantissaBits | mantissa, which
// can exceed the format's largest finite encoding: callers decide between infinity and saturation.
// Scaling by powers of two is exact in double, so std::nearbyint (round-to-nearest-even in the
// default rounding mode) performs the only rounding.
uint32_t encodeMagnitude(double magnitude, int mantissaBits, int bias) {
  if (magnitude == 0.0) return 0;
  int frexpExponent = 0;
  std::frexp(magnitude, &frexpExponent);
  const int exponent = frexpExponent - 1;  // magnitude is in [2^exponent, 2^(exponent+1))
  const int minNormalExponent = 1 - bias;
  if (exponent < minNormalExponent) {
    // Subnormal: a multiple of 2^(minNormalExponent - mantissaBits). Rounding up to
    // 1 << mantissaBits yields the smallest normal's encoding, which is exactly right.
    return static_cast<uint32_t>(
        std::nearbyint(std::ldexp(magnitude, mantissaBits - minNormalExponent)));
  }
  uint64_t significand =
      static_cast<uint64_t>(std::nearbyint(std::ldexp(magnitude, mantissaBits - exponent)));
  int biasedExponent = exponent + bias;
  if (significand == (uint64_t{1} << (mantissaBits + 1))) {
    significand >>= 1;
    ++biasedExponent;
  }
  if (biasedExponent > 0x7fff) biasedExponent = 0x7fff;  // far beyond any format: plainly overflow
  return (static_cast<uint32_t>(biasedExponent) << mantissaBits) |
         static_cast<uint32_t>(significand - (uint64_t{1} << mantissaBits));
}

double decodeMagnitude(uint32_t field, int mantissaBits, int bias) {
  const uint32_t exponent = field >> mantissaBits;
  const uint32_t mantissa = field & ((1u << mantissaBits) - 1);
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissaBits);
  return std::ldexp(static_cast<double>((1u << mantissaBits) | mantissa),
                    static_cast<int>(exponent) - bias - mantissaBits);
}

}  // namespace

uint16_t encodeHalf(double value) {
  if (std::isnan(value)) return 0x7e00;
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isinf(value)) return sign | 0x7c00;
  uint32_t field = encodeMagnitude(std::fabs(value), 10, 15);
  if (field >= 0x7c00) field = 0x7c00;
  return static_cast<uint16_t>(sign | field);
}

double decodeHalf(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const uint32_t field = bits & 0x7fff;
  if ((field >> 10) == 0x1f) {
    return (field & 0x3ff) ? std::numeric_limits<double>::quiet_NaN()
                           : sign * std::numeric_limits<double>::infinity();
  }
  return sign * decodeMagnitude(field, 10, 15);
}

uint16_t encodeBfloat16(double value) {
  if (std::isnan(value)) return 0x7fc0;
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isinf(value)) return sign | 0x7f80;
  uint32_t field = encodeMagnitude(std::fabs(value), 7, 127);
  if (field >= 0x7f80) field = 0x7f80;
  return static_cast<uint16_t>(sign | field);
}

double decodeBfloat16(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const uint32_t field = bits & 0x7fff;
  if ((field >> 7) == 0xff) {
    return (field & 0x7f) ? std::numeric_limits<double>::quiet_NaN()
                          : sign * std::numeric_limits<double>::infinity();
  }
  return sign * decodeMagnitude(field, 7, 127);
}

// e4m3 ("fn" variant): no infinities; S.1111.111 is NaN, so 448 (0x7e) is the largest finite.
uint8_t encodeFp8E4M3(double value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  uint32_t field = std::isinf(value) ? 0x7e : encodeMagnitude(std::fabs(value), 3, 7);
  if (field > 0x7e) field = 0x7e;
  return static_cast<uint8_t>(sign | field);
}

double decodeFp8E4M3(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const uint32_t field = bits & 0x7f;
  if (field == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  return sign * decodeMagnitude(field, 3, 7);
}

// e5m2: IEEE-like with infinities, but conversions saturate, so 57344 (0x7b) is the ceiling.
uint8_t encodeFp8E5M2(double value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  uint32_t field = std::isinf(value) ? 0x7b : encodeMagnitude(std::fabs(value), 2, 15);
  if (field > 0x7b) field = 0x7b;
  return static_cast<uint8_t>(sign | field);
}

double decodeFp8E5M2(uint8_t bits) {
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const uint32_t field = bits & 0x7f;
  if ((field >> 2) == 0x1f) {
    return (field & 0x3) ? std::numeric_limits<double>::quiet_NaN()
                         : sign * std::numeric_limits<double>::infinity();
  }
  return sign * decodeMagnitude(field, 2, 15);
}

namespace {

// Arithmetic per element type. Integers wrap (computed in the unsigned type, so signed overflow
// is defined); narrow floats compute in double and round once to the type. For +, -, * double
// rounding through a format of at least 2p+2 bits is innocuous, so the result equals a correctly
// rounded operation in the narrow type, like the GPU's __hadd/__hmul.
template <typename Storage, double (*Decode)(Storage), Storage (*Encode)(double)>
struct NarrowFloat {
  using T = Storage;
  static T add(T a, T b) { return Encode(Decode(a) + Decode(b)); }
  static T mul(T a, T b) { return Encode(Decode(a) * Decode(b)); }
  static T max(T a, T b) { return Decode(b) > Decode(a) ? b : a; }
  static T min(T a, T b) { return Decode(b) < Decode(a) ? b : a; }
  static T divide(T a, int) { return a; }  // unused: float Avg is a PreMulSum
};

template <typename F>
struct NativeFloat {
  using T = F;
  static T add(T a, T b) { return a + b; }
  static T mul(T a, T b) { return a * b; }
  static T max(T a, T b) { return b > a ? b : a; }
  static T min(T a, T b) { return b < a ? b : a; }
  static T divide(T a, int) { return a; }
};

template <typename I>
struct Integer {
  using T = I;
  using U = std::make_unsigned_t<I>;
  static T add(T a, T b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  static T mul(T a, T b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  static T max(T a, T b) { return b > a ? b : a; }
  static T min(T a, T b) { return b < a ? b : a; }
  static T divide(T a, int n) { return static_cast<T>(a / static_cast<T>(n)); }
};

using Half = NarrowFloat<uint16_t, decodeHalf, encodeHalf>;
using Bfloat16 = NarrowFloat<uint16_t, decodeBfloat16, encodeBfloat16>;
using Fp8E4M3 = NarrowFloat<uint8_t, decodeFp8E4M3, encodeFp8E4M3>;
using Fp8E5M2 = NarrowFloat<uint8_t, decodeFp8E5M2, encodeFp8E5M2>;

template <typename Ops>
void reduceTyped(Reduction reduction, const void* const* inputs, const Scalar* scalars, int ninputs,
                 size_t count, void* out) {
  using T = typename Ops::T;
  auto load = [](const void* base, size_t i) {
    T value;
    std::memcpy(&value, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
    return value;
  };
  auto scalarOf = [&](int r) {
    T value;
    std::memcpy(&value, scalars[r].bytes, sizeof(T));
    return value;
  };
  for (size_t i = 0; i < count; ++i) {
    T acc = load(inputs[0], i);
    if (reduction == Reduction::kPreMulSum) acc = Ops::mul(acc, scalarOf(0));
    for (int r = 1; r < ninputs; ++r) {
      T next = load(inputs[r], i);
      switch (reduction) {
        case Reduction::kSum:
        case Reduction::kSumPostDiv:
          acc = Ops::add(acc, next);
          break;
        case Reduction::kProd:
          acc = Ops::mul(acc, next);
          break;
        case Reduction::kMax:
          acc = Ops::max(acc, next);
          break;
        case Reduction::kMin:
          acc = Ops::min(acc, next);
          break;
        case Reduction::kPreMulSum:
          acc = Ops::add(acc, Ops::mul(next, scalarOf(r)));
          break;
      }
    }
    if (reduction == Reduction::kSumPostDiv) acc = Ops::divide(acc, ninputs);
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

template <typename T>
Scalar scalarOfValue(T value) {
  Scalar s;
  std::memcpy(s.bytes, &value, sizeof(T));
  return s;
}

}  // namespace

Scalar scalarFromDouble(ncclDataType_t type, double value) {
  switch (type) {
    case ncclInt8:
      return scalarOfValue(static_cast<int8_t>(value));
    case ncclUint8:
      return scalarOfValue(static_cast<uint8_t>(value));
    case ncclInt32:
      return scalarOfValue(static_cast<int32_t>(value));
    case ncclUint32:
      return scalarOfValue(static_cast<uint32_t>(value));
    case ncclInt64:
      return scalarOfValue(static_cast<int64_t>(value));
    case ncclUint64:
      return scalarOfValue(static_cast<uint64_t>(value));
    case ncclFloat16:
      return scalarOfValue(encodeHalf(value));
    case ncclFloat32:
      return scalarOfValue(static_cast<float>(value));
    case ncclFloat64:
      return scalarOfValue(value);
    case ncclBfloat16:
      return scalarOfValue(encodeBfloat16(value));
    case ncclFloat8e4m3:
      return scalarOfValue(encodeFp8E4M3(value));
    case ncclFloat8e5m2:
      return scalarOfValue(encodeFp8E5M2(value));
    default:
      return Scalar{};
  }
}

Scalar averageScalar(ncclDataType_t type, int nranks) {
  if (type == ncclFloat64) return scalarFromDouble(type, 1.0 / nranks);
  return scalarFromDouble(type, static_cast<double>(static_cast<float>(1.0 / nranks)));
}

void reduceElements(ncclDataType_t type, Reduction reduction, const void* const* inputs,
                    const Scalar* scalars, int ninputs, size_t count, void* out) {
  switch (type) {
    case ncclInt8:
      return reduceTyped<Integer<int8_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclUint8:
      return reduceTyped<Integer<uint8_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclInt32:
      return reduceTyped<Integer<int32_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclUint32:
      return reduceTyped<Integer<uint32_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclInt64:
      return reduceTyped<Integer<int64_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclUint64:
      return reduceTyped<Integer<uint64_t>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclFloat16:
      return reduceTyped<Half>(reduction, inputs, scalars, ninputs, count, out);
    case ncclFloat32:
      return reduceTyped<NativeFloat<float>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclFloat64:
      return reduceTyped<NativeFloat<double>>(reduction, inputs, scalars, ninputs, count, out);
    case ncclBfloat16:
      return reduceTyped<Bfloat16>(reduction, inputs, scalars, ninputs, count, out);
    case ncclFloat8e4m3:
      return reduceTyped<Fp8E4M3>(reduction, inputs, scalars, ninputs, count, out);
    case ncclFloat8e5m2:
      return reduceTyped<Fp8E5M2>(reduction, inputs, scalars, ninputs, count, out);
    default:
      return;
  }
}

}  // namespace ncclsim
