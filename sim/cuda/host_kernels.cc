// PyTorch's contiguous elementwise loops, computed on the host. A kernel is recognised from its
// demangled name alone:
//   at::native::vectorized_elementwise_kernel<V, F, std::array<char*, K>[, bool]>
//       (int N, F f, std::array<char*, K> data)
//   at::native::unrolled_elementwise_kernel<F, std::array<char*, K>, ...>
//       (int N, F f, std::array<char*, K> data, TrivialOffsetCalculator<..>,
//        TrivialOffsetCalculator<..>, memory::LoadWithoutCast, memory::StoreWithoutCast)
// data[0] is the output and data[1..K-1] the inputs, each N contiguous elements of the functor's
// scalar type. The functors' layouts are PyTorch's (ATen/native/cuda/Loops.cuh, the generated
// ufunc functors, FillFunctor):
//   FillFunctor<T>            { T value; }                        out = value
//   CUDAFunctor_add<T>        { opmath alpha; }                   out = a + alpha * b
//   CUDAFunctorOnSelf_add<T>  { opmath other; opmath alpha; }     out = in + alpha * other
//   CUDAFunctorOnOther_add<T> { opmath self; opmath alpha; }      out = self + alpha * in
//   BinaryFunctor<T,T,T,G>    { G g; }                            out = g(a, b)
//   AUnaryFunctor<T,T,T,G>    { G g; opmath a; }                  out = g(a, in)
//   BUnaryFunctor<T,T,T,G>    { G g; opmath b; }                  out = g(in, b)
// with G = binary_internal::MulFunctor or DivFunctor (empty), opmath = T for the types below.
// a + alpha * b is one fused multiply-add, as nvcc contracts it by default.
#include "host_kernels.h"

#include <cxxabi.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cudasim_ext.h"

namespace cudasim {
namespace {

enum class Element { kFloat, kDouble, kInt8, kUInt8, kInt16, kInt32, kInt64, kBytesOnly };

struct ElementInfo {
  const char* name;  // as demangled, spaces removed
  Element element;
  size_t bytes;
};

// Arithmetic on the first seven; the rest can only be filled (a bit pattern of known size).
constexpr ElementInfo kElements[] = {
    {"float", Element::kFloat, 4},
    {"double", Element::kDouble, 8},
    {"signedchar", Element::kInt8, 1},
    {"unsignedchar", Element::kUInt8, 1},
    {"short", Element::kInt16, 2},
    {"int", Element::kInt32, 4},
    {"long", Element::kInt64, 8},
    {"bool", Element::kBytesOnly, 1},
    {"c10::Half", Element::kBytesOnly, 2},
    {"c10::BFloat16", Element::kBytesOnly, 2},
    {"unsignedshort", Element::kBytesOnly, 2},
    {"unsignedint", Element::kBytesOnly, 4},
    {"unsignedlong", Element::kBytesOnly, 8},
    {"c10::complex<float>", Element::kBytesOnly, 8},
    {"c10::complex<double>", Element::kBytesOnly, 16},
    {"c10::Float8_e4m3fn", Element::kBytesOnly, 1},
    {"c10::Float8_e5m2", Element::kBytesOnly, 1},
};

const ElementInfo* findElement(std::string_view name) {
  for (const ElementInfo& info : kElements) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

enum class Op {
  kFill,
  kAdd,         // a + alpha * b
  kAddOnSelf,   // in + alpha * other
  kAddOnOther,  // self + alpha * in
  kMul,         // a * b
  kMulScalarA,  // a * in
  kMulScalarB,  // in * b
  kDiv,         // a / b
  kDivScalarA,  // a / in
  kDivScalarB,  // in / b
};

const char* opName(Op op) {
  switch (op) {
    case Op::kFill:
      return "fill";
    case Op::kAdd:
      return "add";
    case Op::kAddOnSelf:
      return "add scalar";
    case Op::kAddOnOther:
      return "add to scalar";
    case Op::kMul:
      return "mul";
    case Op::kMulScalarA:
    case Op::kMulScalarB:
      return "mul scalar";
    case Op::kDiv:
      return "div";
    case Op::kDivScalarA:
      return "scalar div";
    case Op::kDivScalarB:
      return "div scalar";
  }
  return "?";
}

int inputCount(Op op) {
  switch (op) {
    case Op::kFill:
      return 0;
    case Op::kAdd:
    case Op::kMul:
    case Op::kDiv:
      return 2;
    default:
      return 1;
  }
}

// ---- arithmetic, per element type ----------------------------------------------------------

template <typename T>
T load(const char* base, int index) {
  T value;
  std::memcpy(&value, base + static_cast<size_t>(index) * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void store(char* base, int index, T value) {
  std::memcpy(base + static_cast<size_t>(index) * sizeof(T), &value, sizeof(T));
}

// Integers wrap as on the GPU (two's complement), without C++'s signed-overflow UB.
template <typename T>
T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}
template <typename T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <typename T>
T addScaled(T a, T b, T alpha) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::fma(alpha, b, a);
  } else {
    return wrapAdd(a, wrapMul(alpha, b));
  }
}

template <typename T>
T multiply(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a * b;
  } else {
    return wrapMul(a, b);
  }
}

struct Launch {
  Op op;
  int count;
  char* out;
  const char* in0;
  const char* in1;
  unsigned char scalars[2][16];  // the functor's scalars, as stored in it
};

template <typename T>
void compute(const Launch& launch) {
  T s0, s1;
  std::memcpy(&s0, launch.scalars[0], sizeof(T));
  std::memcpy(&s1, launch.scalars[1], sizeof(T));
  for (int i = 0; i < launch.count; ++i) {
    T result{};
    switch (launch.op) {
      case Op::kFill:
        result = s0;
        break;
      case Op::kAdd:
        result = addScaled(load<T>(launch.in0, i), load<T>(launch.in1, i), s0);
        break;
      case Op::kAddOnSelf:
        result = addScaled(load<T>(launch.in0, i), s0, s1);
        break;
      case Op::kAddOnOther:
        result = addScaled(s0, load<T>(launch.in0, i), s1);
        break;
      case Op::kMul:
        result = multiply(load<T>(launch.in0, i), load<T>(launch.in1, i));
        break;
      case Op::kMulScalarA:
        result = multiply(s0, load<T>(launch.in0, i));
        break;
      case Op::kMulScalarB:
        result = multiply(load<T>(launch.in0, i), s0);
        break;
      case Op::kDiv:
        if constexpr (std::is_floating_point_v<T>) {
          result = load<T>(launch.in0, i) / load<T>(launch.in1, i);
        }
        break;
      case Op::kDivScalarA:
        if constexpr (std::is_floating_point_v<T>) result = s0 / load<T>(launch.in0, i);
        break;
      case Op::kDivScalarB:
        if constexpr (std::is_floating_point_v<T>) result = load<T>(launch.in0, i) / s0;
        break;
    }
    store<T>(launch.out, i, result);
  }
}

void fillBytes(const Launch& launch, size_t bytes) {
  for (int i = 0; i < launch.count; ++i) {
    std::memcpy(launch.out + static_cast<size_t>(i) * bytes, launch.scalars[0], bytes);
  }
}

// True when [pointer, pointer + bytes) lies inside one allocation of the sim's heap.
bool insideHeap(const void* pointer, size_t bytes) {
  cudasimHeapRef ref;
  return cudasimHeapLocate(pointer, &ref) == 0 && ref.bytesToEnd >= bytes;
}

class ElementwiseKernel final : public HostKernel {
 public:
  ElementwiseKernel(Op op, const ElementInfo& element, size_t arraySize)
      : op_(op), element_(element), arraySize_(arraySize) {}

  std::function<void()> prepare(void** params) const override {
    Launch launch{};
    launch.op = op_;
    std::memcpy(&launch.count, params[0], sizeof(int));
    copyScalars(static_cast<const unsigned char*>(params[1]), launch);
    char* data[3] = {};
    std::memcpy(data, params[2], arraySize_ * sizeof(char*));
    launch.out = data[0];
    launch.in0 = data[1];
    launch.in1 = data[2];
    if (launch.count <= 0) return [] {};
    size_t bytes = static_cast<size_t>(launch.count) * element_.bytes;
    for (size_t k = 0; k < arraySize_; ++k) {
      if (!insideHeap(data[k], bytes)) return {};
    }
    Element element = element_.element;
    size_t elementBytes = element_.bytes;
    return [launch, element, elementBytes] { run(launch, element, elementBytes); };
  }

  std::string describe() const override { return std::string(opName(op_)) + " " + element_.name; }

 private:
  // Reads the functor's fields at their offsets; scalars[0] is value/alpha/self/other/a/b.
  void copyScalars(const unsigned char* functor, Launch& launch) const {
    size_t size = element_.bytes;
    switch (op_) {
      case Op::kFill:
      case Op::kAdd:
        std::memcpy(launch.scalars[0], functor, size);
        break;
      case Op::kAddOnSelf:
      case Op::kAddOnOther:
        std::memcpy(launch.scalars[0], functor, size);
        std::memcpy(launch.scalars[1], functor + size, size);
        break;
      case Op::kMulScalarA:
      case Op::kMulScalarB:
      case Op::kDivScalarA:
      case Op::kDivScalarB:
        // The empty MulFunctor/DivFunctor takes one byte; the scalar follows at its alignment,
        // which equals its size for every arithmetic type here.
        std::memcpy(launch.scalars[0], functor + size, size);
        break;
      case Op::kMul:
      case Op::kDiv:
        break;
    }
  }

  static void run(const Launch& launch, Element element, size_t elementBytes) {
    switch (element) {
      case Element::kFloat:
        return compute<float>(launch);
      case Element::kDouble:
        return compute<double>(launch);
      case Element::kInt8:
        return compute<int8_t>(launch);
      case Element::kUInt8:
        return compute<uint8_t>(launch);
      case Element::kInt16:
        return compute<int16_t>(launch);
      case Element::kInt32:
        return compute<int32_t>(launch);
      case Element::kInt64:
        return compute<int64_t>(launch);
      case Element::kBytesOnly:
        return fillBytes(launch, elementBytes);
    }
  }

  Op op_;
  ElementInfo element_;
  size_t arraySize_;
};

// ---- recognising names ---------------------------------------------------------------------

std::string withoutSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c != ' ') out.push_back(c);
  }
  return out;
}

// Splits at commas outside any <>, () or {}.
std::vector<std::string_view> splitTopLevel(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '<' || c == '(' || c == '{') ++depth;
    if (c == '>' || c == ')' || c == '}') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(text.substr(start));
  return parts;
}

// When `text` is `name<args>`, returns true and the top-level arguments.
bool templateArguments(std::string_view text, std::string_view name,
                       std::vector<std::string_view>* arguments) {
  if (text.size() < name.size() + 2 || text.substr(0, name.size()) != name ||
      text[name.size()] != '<' || text.back() != '>') {
    return false;
  }
  *arguments = splitTopLevel(text.substr(name.size() + 1, text.size() - name.size() - 2));
  return true;
}

// "std::array<char*,3ul>" -> 3; 0 when not such an array.
size_t pointerArraySize(std::string_view text) {
  std::vector<std::string_view> arguments;
  if (!templateArguments(text, "std::array", &arguments) || arguments.size() != 2 ||
      arguments[0] != "char*") {
    return 0;
  }
  std::string count(arguments[1]);
  char* end = nullptr;
  unsigned long value = std::strtoul(count.c_str(), &end, 10);
  return (end != nullptr && std::strcmp(end, "ul") == 0) ? value : 0;
}

struct Recognised {
  Op op;
  const ElementInfo* element;
};

// Binary/AUnary/BUnary functors of MulFunctor/DivFunctor with one element type throughout.
bool recogniseWrapped(std::string_view functor, Recognised* out) {
  struct Wrapper {
    const char* name;
    Op mul;
    Op div;
  };
  constexpr Wrapper kWrappers[] = {
      {"at::native::BinaryFunctor", Op::kMul, Op::kDiv},
      {"at::native::AUnaryFunctor", Op::kMulScalarA, Op::kDivScalarA},
      {"at::native::BUnaryFunctor", Op::kMulScalarB, Op::kDivScalarB},
  };
  for (const Wrapper& wrapper : kWrappers) {
    std::vector<std::string_view> arguments;
    if (!templateArguments(functor, wrapper.name, &arguments) || arguments.size() != 4) continue;
    if (arguments[0] != arguments[1] || arguments[0] != arguments[2]) return false;
    const ElementInfo* element = findElement(arguments[0]);
    if (element == nullptr || element->element == Element::kBytesOnly) return false;
    std::vector<std::string_view> inner;
    bool isMul = templateArguments(arguments[3], "at::native::binary_internal::MulFunctor", &inner);
    bool isDiv = !isMul &&
                 templateArguments(arguments[3], "at::native::binary_internal::DivFunctor", &inner);
    // The functor computes in opmath_type<T>, which is T itself for these types.
    if ((!isMul && !isDiv) || inner.size() != 1 || inner[0] != arguments[0]) return false;
    bool floating = element->element == Element::kFloat || element->element == Element::kDouble;
    if (isDiv && !floating) return false;  // integer division never reaches DivFunctor<int>
    *out = {isMul ? wrapper.mul : wrapper.div, element};
    return true;
  }
  return false;
}

bool recogniseFunctor(std::string_view functor, Recognised* out) {
  struct Simple {
    const char* name;
    Op op;
  };
  constexpr Simple kSimple[] = {
      {"at::native::FillFunctor", Op::kFill},
      {"at::native::CUDAFunctor_add", Op::kAdd},
      {"at::native::CUDAFunctorOnSelf_add", Op::kAddOnSelf},
      {"at::native::CUDAFunctorOnOther_add", Op::kAddOnOther},
  };
  for (const Simple& simple : kSimple) {
    std::vector<std::string_view> arguments;
    if (!templateArguments(functor, simple.name, &arguments) || arguments.size() != 1) continue;
    const ElementInfo* element = findElement(arguments[0]);
    if (element == nullptr) return false;
    if (simple.op != Op::kFill && element->element == Element::kBytesOnly) return false;
    *out = {simple.op, element};
    return true;
  }
  return recogniseWrapped(functor, out);
}

// The parameter list of "void qualified::name<...>(params)", or empty.
std::string_view parameterList(std::string_view name) {
  size_t angle = name.find('<');
  if (angle == std::string_view::npos) return {};
  int depth = 0;
  for (size_t i = angle; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>' && --depth == 0) {
      if (i + 1 >= name.size() || name[i + 1] != '(' || name.back() != ')') return {};
      return name.substr(i + 2, name.size() - i - 3);
    }
  }
  return {};
}

bool trivialOffsetCalculator(std::string_view text) {
  return text.substr(0, std::string_view("TrivialOffsetCalculator<").size()) ==
         "TrivialOffsetCalculator<";
}

std::unique_ptr<HostKernel> recognise(const std::string& name) {
  const bool vectorized = name.rfind("voidat::native::vectorized_elementwise_kernel<", 0) == 0;
  const bool unrolled = name.rfind("voidat::native::unrolled_elementwise_kernel<", 0) == 0;
  if (!vectorized && !unrolled) return nullptr;
  std::vector<std::string_view> params = splitTopLevel(parameterList(name));
  if (params.size() < 3 || params[0] != "int") return nullptr;
  if (unrolled) {
    // Only the contiguous form: trivial offsets, loads and stores without casts.
    if (params.size() != 7 || !trivialOffsetCalculator(params[3]) ||
        !trivialOffsetCalculator(params[4]) || params[5] != "at::native::memory::LoadWithoutCast" ||
        params[6] != "at::native::memory::StoreWithoutCast") {
      return nullptr;
    }
  } else if (params.size() != 3) {
    return nullptr;
  }
  Recognised recognised;
  if (!recogniseFunctor(params[1], &recognised)) return nullptr;
  size_t arraySize = pointerArraySize(params[2]);
  if (arraySize != static_cast<size_t>(inputCount(recognised.op)) + 1) return nullptr;
  return std::make_unique<ElementwiseKernel>(recognised.op, *recognised.element, arraySize);
}

}  // namespace

std::string demangledName(const char* mangledName) {
  if (mangledName == nullptr) return "(null)";
  int status = 0;
  char* text = abi::__cxa_demangle(mangledName, nullptr, nullptr, &status);
  if (status != 0 || text == nullptr) return mangledName;
  std::string result(text);
  std::free(text);
  return result;
}

std::unique_ptr<HostKernel> findHostKernel(const char* mangledName) {
  // Cheap tests first: PyTorch registers about 24,000 kernels at import; demangle few.
  if (mangledName == nullptr) return nullptr;
  const bool loop = std::strstr(mangledName, "vectorized_elementwise_kernel") != nullptr ||
                    std::strstr(mangledName, "unrolled_elementwise_kernel") != nullptr;
  const bool functor = std::strstr(mangledName, "FillFunctor") != nullptr ||
                       std::strstr(mangledName, "_add") != nullptr ||
                       std::strstr(mangledName, "MulFunctor") != nullptr ||
                       std::strstr(mangledName, "DivFunctor") != nullptr;
  if (!loop || !functor) return nullptr;
  return recognise(withoutSpaces(demangledName(mangledName)));
}

}  // namespace cudasim
