// Element types and reductions of the sim's NCCL, kept free of any CUDA or shared-memory code so
// that unit tests can check them exhaustively.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ncclsim {

// Size in bytes of one element, or 0 for a value outside ncclDataType_t.
size_t dataTypeSize(ncclDataType_t type);
const char* dataTypeName(ncclDataType_t type);  // "float", "half", ... as NCCL's logs name them

// Our own IEEE-style converters. Encoders round to nearest, ties to even. half and bfloat16
// overflow to infinity (as __double2half does); the fp8 types saturate to the largest finite value
// (as __nv_cvt_*_to_fp8 with __NV_SATFINITE does), and only NaN maps to NaN.
uint16_t encodeHalf(double value);
double decodeHalf(uint16_t bits);
uint16_t encodeBfloat16(double value);
double decodeBfloat16(uint16_t bits);
uint8_t encodeFp8E4M3(double value);
double decodeFp8E4M3(uint8_t bits);
uint8_t encodeFp8E5M2(double value);
double decodeFp8E5M2(uint8_t bits);

// The reduction actually applied to the data: the built-in ops, plus the PreMulSum that both
// user-created ops and floating-point Avg turn into, plus the integer Avg (sum, then divide).
enum class Reduction : int { kSum, kProd, kMax, kMin, kPreMulSum, kSumPostDiv };

// A PreMulSum scalar in the element type's own representation (up to 8 bytes).
struct Scalar {
  uint8_t bytes[8] = {};
};

// Writes 1/nranks in `type` the way NCCL builds the scalar of a floating-point Avg: the value is
// first rounded to float (double for ncclFloat64), then to the element type.
Scalar averageScalar(ncclDataType_t type, int nranks);
// Converts a double into `type`'s representation (used by tests to build scalars).
Scalar scalarFromDouble(ncclDataType_t type, double value);

// out[i] = inputs[0][i] (op) inputs[1][i] (op) ... in rank order, rounding to the element type
// after every step, so that every rank computes bitwise the same result. `scalars` (one per input)
// is read only for kPreMulSum, where each input is first multiplied by its own scalar.
// For kSumPostDiv the wrapped integer sum is divided by `ninputs` at the end.
void reduceElements(ncclDataType_t type, Reduction reduction, const void* const* inputs,
                    const Scalar* scalars, int ninputs, size_t count, void* out);

}  // namespace ncclsim
